"""The single-process pipeline simulator: every stage in one process, tick by tick.

It runs exactly the per-stage code of the distributed runtime (``run_tick`` on a
``StageWorker``); only the transport differs (in-process FIFOs here).
"""
from __future__ import annotations

from ..methods import Method, get_method
from ..models import StagedModel
from ..optim import Recipe
from .pipeline import GetBatch, build_workers, run_tick, schedule_for
from .transport import InProcessTransport


class Simulator:
    """Run ``method`` on ``model`` for ``num_batches`` minibatches given by ``get_batch(mb)``.

    The pipeline is drained at the end: every minibatch gets its backward at every stage, and a
    final partial accumulation group (num_batches not a multiple of k) is applied as a mean over
    what it holds.
    """

    def __init__(
        self,
        model: StagedModel,
        method: str | Method,
        *,
        num_batches: int,
        get_batch: GetBatch,
        batch_size: int,
        k: int = 1,
        recipe: Recipe = Recipe(),
        batches_per_epoch: float | None = None,
    ):
        self.model, self.method = model, get_method(method)
        self.get_batch = get_batch
        self.schedule = schedule_for(self.method, len(model), num_batches)
        self.workers = build_workers(
            model, self.method, k=k, recipe=recipe, batch_size=batch_size,
            batches_per_epoch=batches_per_epoch or max(num_batches, 1),
        )
        self.transport = InProcessTransport()
        self.tick = 0

    @property
    def done(self) -> bool:
        return self.tick >= self.schedule.num_ticks

    def step(self) -> None:
        """Advance every stage by one tick (stages in order; messages arrive one tick later)."""
        if self.done:
            return
        if not self.model.training:  # evaluation switched it off (a full train() walks every module)
            self.model.train()
        for worker in self.workers:
            run_tick(worker, self.schedule.action(self.tick, worker.index), self.transport, self.get_batch)
        self.tick += 1
        if self.done:
            for worker in self.workers:
                worker.step()  # flush a final partial accumulation group

    def run(self, ticks: int | None = None) -> "Simulator":
        end = self.schedule.num_ticks if ticks is None else min(self.tick + ticks, self.schedule.num_ticks)
        while self.tick < end:
            self.step()
        return self

    def state_dict(self) -> dict:
        """The in-flight pipeline state (the model's weights and buffers are saved separately)."""
        return {"tick": self.tick, "workers": [w.state_dict() for w in self.workers],
                "transport": self.transport.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.tick = state["tick"]
        for worker, ws in zip(self.workers, state["workers"]):
            worker.load_state_dict(ws)
        self.transport.load_state_dict(state["transport"])

    @property
    def head_log(self) -> list[tuple[int, float, int, int]]:
        """(minibatch, loss, correct, batch size) for every minibatch the head has processed."""
        return self.workers[-1].head_log

    # ---- the distributed pipeline's collective calls, for one process ------------------------------
    rank, world_size, owns_head = 0, 1, True

    def gather_object(self, obj, dst: int = 0) -> list:
        """Every rank's ``obj``: here the only one's."""
        return [obj]

    def gather_head_log(self, dst: int = 0) -> list[tuple[int, float, int, int]]:
        return list(self.head_log)

    def gather_state_dict(self, dst: int = 0) -> dict:
        """The whole model's state_dict (live tensors: copy before changing the model)."""
        return self.model.state_dict()

    def close(self) -> None:
        """Nothing to release (a distributed pipeline stops its threads here)."""


def simulate(model: StagedModel, method: str | Method, batches, *, k: int = 1, recipe: Recipe = Recipe(),
             batches_per_epoch: float | None = None) -> Simulator:
    """Train ``model`` in place with ``method`` on a list of (images, labels) minibatches."""
    batches = list(batches)
    if not batches:
        raise ValueError("simulate needs at least one minibatch")
    return Simulator(
        model, method, num_batches=len(batches), get_batch=batches.__getitem__,
        batch_size=len(batches[0][1]), k=k, recipe=recipe, batches_per_epoch=batches_per_epoch,
    ).run()
