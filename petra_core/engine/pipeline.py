"""Building the workers of a model and running one stage's tick — shared by every transport."""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from torch import Tensor

from ..methods import Method, check_method_fits, get_method
from ..models import StagedModel
from ..optim import Recipe, make_optimizer
from ..schedule import Action, Schedule
from .messages import ForwardMsg
from .worker import StageWorker

GetBatch = Callable[[int], tuple[Tensor, Tensor]]


class Pipeline(Protocol):
    """What the trainer drives: :class:`~petra_core.engine.Simulator` (every stage in one process)
    and :class:`~petra_core.engine.distributed.DistributedPipeline` (this rank's stages).

    ``step()`` runs one tick of this process's stages; ``workers`` are this process's stage
    workers (stage order); ``head_log`` is filled where the head lives. ``gather_*`` are
    collective in a distributed run (every rank calls them, in the same order) and return the
    result on rank ``dst`` only. ``state_dict()`` / ``load_state_dict()`` capture this process's
    in-flight pipeline at a tick boundary (weights and buffers are saved separately).
    """

    schedule: Schedule
    workers: list[StageWorker]
    tick: int
    rank: int
    world_size: int

    @property
    def done(self) -> bool: ...

    @property
    def head_log(self) -> list[tuple[int, float, int, int]]: ...

    def step(self) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def gather_object(self, obj, dst: int = 0) -> list | None: ...

    def gather_head_log(self, dst: int = 0) -> list[tuple[int, float, int, int]] | None: ...

    def gather_state_dict(self, dst: int = 0) -> dict | None: ...

    def close(self) -> None: ...


def check_k(k: object) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"accumulation k must be an integer >= 1, got {k!r}")
    return k


def build_workers(
    model: StagedModel,
    method: str | Method,
    *,
    k: int = 1,
    recipe: Recipe = Recipe(),
    batch_size: int,
    batches_per_epoch: float,
    stages: range | None = None,
) -> list[StageWorker]:
    """One worker per stage (or per stage in ``stages``, for a rank of a distributed run)."""
    method = get_method(method)
    check_method_fits(method, model)
    k = check_k(k)
    J = len(model)
    workers = []
    for j in stages if stages is not None else range(J):
        opt, sched = make_optimizer(model[j], recipe, batch_size=batch_size, k=k, steps_per_epoch=batches_per_epoch / k)
        prev_rebuilds = j > 0 and method.storage_for(model[j - 1], last=False).needs_output_back
        workers.append(StageWorker(model[j], j, J, method, opt, sched, k=k, send_input_back=prev_rebuilds))
    return workers


def run_tick(worker: StageWorker, action: Action, transport, get_batch: GetBatch) -> None:
    """One tick of one stage: forward (receive, compute, send), then backward (same)."""
    j = worker.index
    if action.forward is not None:
        if worker.is_first:
            x, labels = get_batch(action.forward)
            msg = ForwardMsg(action.forward, x, labels)
        else:
            msg = transport.recv_forward(j)
            if msg.mb != action.forward:
                raise RuntimeError(f"stage {j}: expected activation of minibatch {action.forward}, got {msg.mb}")
        out = worker.forward(msg)
        if out is not None:
            transport.send_forward(j, out)
    if action.backward is not None:
        msg = None if worker.is_last else transport.recv_backward(j)
        out = worker.backward(action.backward, msg)
        if out is not None:
            transport.send_backward(j, out)


def schedule_for(method: str | Method, num_stages: int, num_batches: int) -> Schedule:
    return Schedule(get_method(method).schedule, num_stages, num_batches)
