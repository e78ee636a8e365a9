"""The one tick runner: :class:`Pipeline` (stage workers, a schedule, a world) and how to assemble one.

The same runner and per-stage code (:func:`run_stage_tick`) serve the simulator (every stage in
a :class:`~petra_core.engine.world.LocalWorld`) and each rank of a distributed run; it drains the
pipeline once at the end and saves its in-flight state at a tick boundary. A *tick* is the
pipeline's unit of time; a *step* is a worker's optimizer update (one per k backward passes).
"""
from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor

from ..methods import Method, check_method_fits, get_method
from ..models import StagedModel
from ..optim import Recipe, make_optimizer
from ..schedule import Action, Schedule
from .messages import ForwardMsg
from .worker import HeadRecord, StageWorker

GetBatch = Callable[[int], tuple[Tensor, Tensor]]


def check_k(k: object) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"accumulation k must be an integer >= 1, got {k!r}")
    return k


def schedule_for(method: str | Method, num_stages: int, num_batches: int) -> Schedule:
    return Schedule(get_method(method).schedule, num_stages, num_batches)


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
    """One worker per stage (or per stage in ``stages``, for a rank of a distributed run). Stages
    must already be on their devices."""
    method = get_method(method)
    check_method_fits(method, model)
    k = check_k(k)
    J = len(model)
    workers = []
    for j in stages if stages is not None else range(J):
        opt, sched = make_optimizer(model[j], recipe, batch_size=batch_size, k=k, steps_per_epoch=batches_per_epoch / k)
        send_back = j > 0 and method.policy_for(model[j - 1], last=False).needs_output_back
        workers.append(StageWorker(model[j], j, J, method.storage_for(model[j], last=j == J - 1), opt, sched,
                                   k=k, send_input_back=send_back))
    return workers


def run_stage_tick(worker: StageWorker, action: Action, world, get_batch: GetBatch | None) -> None:
    """One tick of one stage: forward (receive, compute, send), then backward (same)."""
    j = worker.index
    if action.forward is not None:
        if worker.is_first:
            x, labels = get_batch(action.forward)
            msg = ForwardMsg(action.forward, x, labels)
        else:
            msg = world.recv_forward(j)
            if msg.mb != action.forward:
                raise RuntimeError(f"stage {j}: expected activation of minibatch {action.forward}, got {msg.mb}")
        out = worker.forward(msg)
        if out is not None:
            world.send_forward(j, out)
    if action.backward is not None:
        msg = world.recv_backward(j) if worker.gradient_in else None
        out = worker.backward(action.backward, msg)
        if out is not None:
            world.send_backward(j, out)


def assemble(model: StagedModel, method: str | Method, world, *, num_batches: int, get_batch: GetBatch | None,
             batch_size: int, k: int = 1, recipe: Recipe = Recipe(), batches_per_epoch: float | None = None,
             placement="even", measure: Callable | None = None, sample: tuple[Tensor, Tensor] | None = None,
             sync_timing: bool = False) -> dict:
    """The parts of a :class:`Pipeline` of ``model`` in ``world``: ``Pipeline(**assemble(...))``.

    Every rank calls it alike, with an identical ``model`` (same seed; ranks check they agree).
    Rank 0 decides the placement (``"even"``, ranges like ``"0-3,4-9"``, or ``"balanced"``: costs
    from ``measure(model, sample or get_batch(0), method=, device=)``, e.g.
    :func:`petra_core.accounting.measure_stage_costs`). This process's stages move to their devices
    (``world.device_for``) and get workers; ``get_batch`` is called only where stage 0 lives.
    """
    from ..placement import parse_placement

    method = get_method(method)
    J = len(model)
    schedule = schedule_for(method, J, num_batches)
    if world.world_size > 1:
        from .distributed.world import model_fingerprint

        config = (getattr(model, "arch", None), J, method.name, num_batches, k, batch_size, model_fingerprint(model))
        configs = world.all_objects(config)
        differ = [r for r, c in enumerate(configs) if c != configs[0]]
        if differ:
            raise ValueError(f"ranks disagree on (arch, stages, method, minibatches, k, batch, weights): rank 0 has "
                             f"{configs[0][:-1]}, ranks {differ} differ (same seed on every rank?): "
                             + "; ".join(f"rank {r}: {configs[r][:-1]}" for r in differ))
    decision = None
    if world.is_main:
        try:
            costs = None
            if placement == "balanced":
                if measure is None or (get_batch is None and sample is None):
                    raise ValueError("placement 'balanced' needs measured stage costs: pass measure= (e.g. "
                                     "petra_core.accounting.measure_stage_costs) and a sample minibatch")
                costs = measure(model, sample if sample is not None else get_batch(0), method=method,
                                device=world.device_for(0) or next(model.parameters()).device)
            decision = (parse_placement(placement, J, world.world_size, costs), costs)
        except ValueError as err:  # a bad spec: every rank raises it, none waits for the others
            decision = str(err)
    decision = world.share(decision)
    if isinstance(decision, str):
        raise ValueError(decision)
    ranges, world.stage_costs = decision
    world.connect(ranges, schedule, backward=method.gradients_cross)
    for j in world.stages:
        if world.device_for(j) is not None:
            model[j].to(world.device_for(j))
    first = next(model[world.stages.start].parameters()).device
    if get_batch is not None and first.type != "cpu":
        user_get_batch = get_batch

        def get_batch(mb: int):  # stage 0's device: labels travel with the activations
            return tuple(t.to(first, non_blocking=True) for t in user_get_batch(mb))

    workers = build_workers(model, method, k=k, recipe=recipe, batch_size=batch_size,
                            batches_per_epoch=batches_per_epoch or max(num_batches, 1), stages=world.stages)
    return dict(workers=workers, schedule=schedule, world=world, get_batch=get_batch, model=model, method=method,
                sync_timing=sync_timing)


class Pipeline:
    """Runs ``workers`` (this process's stages, in order) through ``schedule`` in ``world``.

    ``get_batch(mb)`` gives minibatch ``mb`` to stage 0 (only the process that owns it calls it).
    ``model`` and ``method`` are kept for observers (accounting) and gathers.
    """

    def __init__(self, workers: list[StageWorker], schedule: Schedule, world, *, get_batch: GetBatch | None,
                 model: StagedModel, method: Method, sync_timing: bool = False):
        self.workers, self.schedule, self.world = workers, schedule, world
        self.get_batch, self.model, self.method = get_batch, model, method
        self.stages = world.stages
        self.tick = 0
        world.clock = lambda: self.tick  # failure reports say where this process was
        self.sync_timing = sync_timing and workers[0].device.type == "cuda"
        self.wall_s = 0.0  # seconds spent in this process's ticks
        self.tick_ends: list[float] = []  # perf_counter() at the end of each tick
        model.train()

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def world_size(self) -> int:
        return self.world.world_size

    @property
    def done(self) -> bool:
        return self.tick >= self.schedule.num_ticks

    # ---- running ----------------------------------------------------------------------------------
    def advance(self) -> None:
        """Run one tick of this process's stages; after the last one, flush partial accumulation."""
        if self.done:
            return
        if not self.model.training:  # evaluation switched it off (a full train() walks every module)
            self.model.train()
        t0 = time.perf_counter()
        stage = None
        try:
            self.world.begin_tick(self.tick)
            for worker in self.workers:
                stage = worker.index
                run_stage_tick(worker, self.schedule.action(self.tick, stage), self.world, self.get_batch)
            stage = None
            self.tick += 1
            if self.done:
                for worker in self.workers:
                    stage = worker.index
                    worker.step()  # flush a final partial accumulation group
                stage = None
                self.world.finish()
            if self.sync_timing:
                torch.cuda.synchronize(self.workers[0].device)
        except Exception as err:
            raised = self.world.failure(err, stage, self.tick)
            if raised is None:
                raise
            raise raised from err
        finally:
            t1 = time.perf_counter()
            self.wall_s += t1 - t0
            self.tick_ends.append(t1)

    def run(self, ticks: int | None = None) -> "Pipeline":
        end = self.schedule.num_ticks if ticks is None else min(self.tick + ticks, self.schedule.num_ticks)
        while self.tick < end:
            self.advance()
        return self

    def close(self) -> None:
        self.world.close()

    # ---- what it saw ------------------------------------------------------------------------------
    @property
    def head_log(self) -> list[HeadRecord]:
        """(mb, loss, correct, n) of every minibatch the head has processed; empty where the head
        lives elsewhere. Reading it copies the head's unread values from its device."""
        return self.workers[-1].head_log.records() if self.workers[-1].is_last else []

    # ---- gathers (collective: every rank calls them, in the same order) --------------------------
    def gather_object(self, obj, dst: int = 0) -> list | None:
        """Every rank's ``obj`` in rank order on rank ``dst``, None elsewhere."""
        return self.world.gather_object(obj, dst)

    def stage_state_dicts(self, cpu: bool = True) -> dict[int, dict[str, Tensor]]:
        """{stage index: state_dict} of this process's stages."""
        return {j: {k: (v.detach().cpu() if cpu else v) for k, v in self.model[j].state_dict().items()}
                for j in self.stages}

    def gather_state_dict(self, dst: int = 0) -> dict[str, Tensor] | None:
        """The whole model's state_dict (keys as ``model.state_dict()``) on rank ``dst``. In one
        process: the live tensors (copy before changing the model); across ranks: CPU copies."""
        if self.world_size == 1:
            return self.model.state_dict()
        parts = self.gather_object(self.stage_state_dicts(), dst)
        if parts is None:
            return None
        merged = {j: sd for part in parts for j, sd in part.items()}
        return {f"{j}.{k}": v for j in range(len(self.model)) for k, v in merged[j].items()}

    def gather_head_log(self, dst: int = 0) -> list[HeadRecord] | None:
        logs = self.gather_object(self.head_log, dst)
        return logs[-1] if logs is not None else None

    # ---- checkpointing ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This process's in-flight pipeline at a tick boundary: its workers' state (storage
        records, gradients, optimizer and scheduler) and the messages sent to its stages but not
        yet consumed. Weights and buffers are saved separately. Every rank calls it at the same tick."""
        from ..placement import format_placement

        return {"tick": self.tick, "rank": self.rank, "world_size": self.world_size,
                "placement": format_placement(self.world.placement),
                "workers": {w.index: w.state_dict() for w in self.workers}, "world": self.world.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` on a fresh pipeline (after loading the stages' weights)."""
        from ..placement import format_placement

        if "transport" in state:  # written by petra 0.1's simulator
            state = {**state, "world": state["transport"], "workers": dict(enumerate(state["workers"])),
                     "rank": 0, "world_size": 1, "placement": format_placement(self.world.placement)}
        if (state["world_size"], state["rank"]) != (self.world_size, self.rank):
            raise ValueError(f"checkpoint of rank {state['rank']} of {state['world_size']} cannot be loaded on "
                             f"rank {self.rank} of {self.world_size}")
        if state["placement"] != format_placement(self.world.placement):
            raise ValueError(f"checkpoint placement {state['placement']} differs from this run's "
                             f"{format_placement(self.world.placement)}")
        self.tick = state["tick"]
        for worker in self.workers:
            worker.load_state_dict(state["workers"][worker.index])
        self.world.load_state_dict(state["world"])
