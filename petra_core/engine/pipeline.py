"""The one tick runner: :class:`Pipeline` (stage workers of each replica, a schedule, a replica
rule, a world); :meth:`Pipeline.build` makes one of a :class:`~petra_core.engine.spec.PipelineSpec`
(its steps: ``assembly.py``).

The same runner and per-stage code (:func:`run_stage_tick`) serve the simulator (every replica
and stage in a :class:`~petra_core.engine.worlds.LocalWorld`) and each rank of a distributed run.
A *tick* is the pipeline's unit of time: every stage copy this process holds runs its forward and
backward of the tick, then every stage copy that has accumulated k backward passes *steps* (its
replica rule first combines the copies' gradients). The pipeline is drained once at the end and
its in-flight state saved at a tick boundary.

Replica r's minibatch t is minibatch ``t * R + r`` of the run's one stream (``get_batch``): the
replicas' shards are disjoint and deterministic, and R replicas of batch b see exactly what one
replica accumulating R minibatches sees.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..methods import Method
from ..methods.schedule import Action, Schedule
from ..replicas import ReplicaRule
from .assembly import Replica, agree_on_spec, build_workers, decide_placement, feed_stage_0, place_stages
from .messages import ForwardMsg
from .observers import Observer, observed
from .spec import GetBatch, PipelineSpec
from .stage_streams import NoStageStreams, StageStreams, check_stage_streams
from .worker import HeadRecord, StageWorker
from .worlds import LocalTransport


def run_stage_tick(
    worker: StageWorker,
    action: Action,
    world,
    fetch: Callable[[int, int], tuple] | None,
    observers: Sequence[Observer] = (),
) -> None:
    """One tick of one stage copy: forward (receive, compute, send: with its graph where the next
    stage joins it, unless an observer watches each stage's own backward), then backward (receive,
    rebuild, backpropagate, send). ``fetch(replica, mb)`` gives stage 0 its minibatch."""
    j, r = worker.index, worker.replica
    if action.forward is not None:
        mb = action.forward
        if worker.is_first:
            msg = ForwardMsg(mb, *fetch(r, mb))
        else:
            msg = world.transport.recv_forward(r, j)
            if msg.mb != mb:
                raise RuntimeError(f"stage {j}: expected activation of minibatch {mb}, got {msg.mb}")
        out = observed(observers, "forward", worker, mb, worker.forward, msg, worker.joins_next and not observers)
        if out is not None:
            observed(observers, "send", worker, mb, world.transport.send_forward, r, j, out)
            for o in observers:
                o.sent(worker, "forward", out)
    if action.backward is not None:
        mb = action.backward
        msg = world.transport.recv_backward(r, j) if worker.gradient_in else None
        graph = observed(observers, "rebuild", worker, mb, worker.rebuild, mb, msg)
        out = observed(observers, "backward", worker, mb, worker.backward, mb, msg, graph)
        del graph
        if out is not None:
            observed(observers, "send", worker, mb, world.transport.send_backward, r, j, out)
            for o in observers:
                o.sent(worker, "backward", out)


class Pipeline:
    """Runs this process's replicas (each: its stage workers, in order) through ``schedule`` in
    ``world``, combining the copies of a stage with ``rule`` at every step.

    ``get_batch(mb)`` gives minibatch ``mb`` of the run's stream to stage 0 (only a process that
    holds stage 0 calls it). ``observers`` see every phase (:mod:`~petra_core.engine.observers`).
    ``model`` and ``workers`` are those of this process's first replica.
    """

    def __init__(
        self,
        replicas: list[Replica],
        schedule: Schedule,
        world,
        *,
        get_batch: GetBatch | None,
        method: Method,
        rule: ReplicaRule,
        stage_costs: list[float] | None = None,
        sync_timing: bool = False,
        offset: int = 0,
        observers: Sequence[Observer] = (),
        stage_streams: bool = False,
    ):
        """The parts :meth:`build` makes of a :class:`PipelineSpec` (checked there)."""
        self.replicas, self.schedule, self.world = replicas, schedule, world
        self.get_batch, self.method, self.rule, self.stage_costs = get_batch, method, rule, stage_costs
        self.model, self.workers, self.stages = replicas[0].model, replicas[0].workers, world.placement.stages
        self.observers: list[Observer] = list(observers)
        self.offset = offset  # replica r runs its schedule offset * r ticks after replica 0 (cyclic execution)
        self.num_ticks = schedule.num_ticks + offset * (world.placement.mesh.replicas - 1)
        self.waiting: dict[tuple[int, int], StageWorker] = {}  # (replica, stage) -> gave its part, not yet stepped
        # one replica whose weights stay fixed in flight: steps wait for the flush (_steps_of_the_tick)
        self.defer_steps = schedule.fixed_weights_in_flight and world.placement.mesh.replicas == 1
        self.deferred: set[int] = set()  # stages the table said step and have not been looked at for a step
        self.tick = 0
        self.sync_timing = sync_timing and self.workers[0].device.type == "cuda"
        self.wall_s = 0.0  # seconds spent in this process's ticks
        self.tick_ends: list[float] = []  # perf_counter() at the end of each tick
        for rep in replicas:
            rep.model.train()
        self.streams = NoStageStreams()
        if stage_streams:
            check_stage_streams(
                stage_streams,
                devices=[w.device for rep in replicas for w in rep.workers],
                replicas=len(replicas),
                one_process=isinstance(world.transport, LocalTransport),
            )
            self.streams = StageStreams(self.workers)
            world.transport.takers_own_streams = True

    @classmethod
    def build(cls, spec: PipelineSpec) -> Pipeline:
        """The pipeline ``spec`` describes (every rank builds its own of the same spec): the ranks
        agree on it, rank 0 decides the placement, this process's stages go to their devices (one
        copy of the model per replica it holds) and get their workers."""
        agree_on_spec(spec)
        ranges, stage_costs = decide_placement(spec)
        models = place_stages(spec, ranges)
        return cls(
            [Replica(r, m, build_workers(spec, m, r)) for r, m in models.items()],
            spec.schedule,
            spec.world,
            get_batch=feed_stage_0(spec.get_batch, spec.model, spec.world.placement.stages),
            method=spec.method,
            rule=spec.rule,
            stage_costs=stage_costs,
            sync_timing=spec.sync_timing,
            offset=spec.offset,
            observers=spec.observers,
            stage_streams=spec.stage_streams,
        )

    rank = property(lambda self: self.world.placement.rank)  # the world's, as the runner's own
    world_size = property(lambda self: self.world.placement.world_size)
    placement = property(lambda self: self.world.placement.ranges)  # list[range]: each pipeline position's stages

    done = property(lambda self: self.tick >= self.num_ticks)

    # ---- running ----------------------------------------------------------------------------------
    def fetch(self, replica: int, mb: int):
        """Replica ``replica``'s minibatch ``mb``: minibatch ``mb * R + replica`` of the stream."""
        global_mb = mb * self.world.placement.mesh.replicas + replica
        batch = self.get_batch(global_mb)
        for o in self.observers:
            o.fetched(replica, global_mb, batch)
        return batch

    def advance(self) -> None:
        """Run one tick of this process's stage copies as the schedule's table says, then the steps
        that are due; after the last tick, apply every partial accumulation group."""
        if self.done:
            return
        self._keep_training()
        t0 = time.perf_counter()
        stage = None
        stepping: set[int] = set()  # stages the table says step at the end of this tick
        try:
            self.world.begin_tick(self.tick)
            for rep, local in self._replica_ticks():
                for stage in self._my_busy_stages(local):
                    action = self.schedule.action(local, stage)
                    self._act(rep.workers[stage - self.stages.start], action)
                    if action.step:
                        stepping.add(stage)
            stage = None
            self.streams.join()
            self._steps_of_the_tick(stepping)
            self.world.end_tick(self.tick)
            self.tick += 1
            if self.done:
                self._drain()
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

    def _keep_training(self) -> None:
        for rep in self.replicas:
            if not rep.model.training:  # evaluation switched it off (a full train() walks every module)
                rep.model.train()

    def _replica_ticks(self) -> list[tuple[Replica, int]]:
        """(replica, its own tick) for the replicas whose schedule runs at this tick (cyclic offset)."""
        ticks = [(rep, self.tick - self.offset * rep.index) for rep in self.replicas]
        return [(rep, local) for rep, local in ticks if 0 <= local < self.schedule.num_ticks]

    def _my_busy_stages(self, local: int) -> list[int]:
        """The stages of this process that act at the replica's tick ``local``, in stage order."""
        return [j for j in self.schedule.busy(local) if j in self.stages]

    def _act(self, worker: StageWorker, action: Action) -> None:
        """One stage copy's action: a step still waiting for the replicas' exchange first (its
        weights are needed now), the rule's weights for a forward, then the tick's work."""
        if (worker.replica, worker.index) in self.waiting:
            self._take_step(worker)
        if action.forward is not None:  # a rule may swap in another version of the weights
            self.rule.before_forward(worker, self.world.groups.replica_group(worker.index))
        with self.streams.acting(worker):
            run_stage_tick(worker, action, self.world, self.fetch, self.observers)

    def _steps_of_the_tick(self, stepping: set[int]) -> None:
        """Steps due at the end of the tick; one replica whose weights stay fixed in flight waits for
        the flush (nothing to overlap, no weight read before it: the same bits, fewer exchanges)."""
        self.deferred |= stepping
        if not self.defer_steps or self.schedule.flushed(self.tick):  # (the last tick is a flush)
            self._take_deferred_steps()

    def _drain(self) -> None:
        """After the last tick: every partial accumulation group steps, and the world finishes."""
        for rep in self.replicas:
            for worker in rep.workers:
                worker.complete_partial_group()
        self._contribute(lambda w: w.pending > 0)
        self.complete_steps()
        self.world.finish()

    def _contribute(self, due: Callable[[StageWorker], bool], stages: set[int] | None = None) -> None:
        """Every stage copy that is ``due`` gives its part to the replica rule; a copy the rule says
        is ready steps now, the others right before their next forward or backward (an exchange
        over other processes runs meanwhile) or before anyone reads the weights. ``stages``: those
        to look at (default: all)."""
        for i, j in enumerate(self.stages):
            if stages is not None and j not in stages:
                continue  # nothing of it can be due
            group = self.world.groups.replica_group(j)
            copies = [rep.workers[i] for rep in self.replicas]
            for worker in copies:
                if due(worker) and (worker.replica, j) not in self.waiting:
                    self.rule.contribute(worker, group)
                    self.waiting[worker.replica, j] = worker
            for worker in copies:
                if (worker.replica, j) in self.waiting and self.rule.ready(worker, group):
                    self._take_step(worker)

    def _take_deferred_steps(self) -> None:
        stages, self.deferred = self.deferred, set()
        self._contribute(lambda w: w.step_due, stages | {j for _, j in self.waiting})  # waiting: ready?

    def _take_step(self, worker: StageWorker) -> None:
        j = worker.index
        group = self.world.groups.replica_group(j)
        del self.waiting[worker.replica, j]
        observed(self.observers, "step", worker, None, worker.step, self.rule.complete(worker, group))
        copies = [rep.workers[j - self.stages.start] for rep in self.replicas]
        if all((c.replica, j) not in self.waiting and c.steps == worker.steps for c in copies):
            self.rule.after_step(copies, group)

    def complete_steps(self) -> None:
        """Take every step still waiting for the replicas' exchange or the period's end (before weights are read)."""
        if self.deferred:
            self._take_deferred_steps()
        for key in sorted(self.waiting):
            if key in self.waiting:
                self._take_step(self.waiting[key])
        for worker in (w for rep in self.replicas for w in rep.workers):
            self.rule.settle(worker, self.world.groups.replica_group(worker.index))

    def run(self, ticks: int | None = None) -> Pipeline:
        end = self.num_ticks if ticks is None else min(self.tick + ticks, self.num_ticks)
        while self.tick < end:
            self.advance()
        return self

    def close(self) -> None:
        self.rule.close()
        self.world.close()

    # ---- what it saw ------------------------------------------------------------------------------
    @property
    def head_log(self) -> list[HeadRecord]:
        """(mb, loss, sums, n) of every minibatch the heads of this process's replicas have
        processed, ``mb`` the stream's minibatch id; empty where no head lives. Reading it copies the
        heads' unread values from their devices."""
        if not self.workers[-1].is_last:
            return []
        R = self.world.placement.mesh.replicas
        if len(self.replicas) == 1 and R == 1:
            return self.workers[-1].head_log.records()
        records = [
            r._replace(mb=r.mb * R + rep.index) for rep in self.replicas for r in rep.workers[-1].head_log.records()
        ]
        return sorted(records, key=lambda r: r.mb)

    # ---- gathers (collective: every rank calls them, in the same order) --------------------------
    def gather_object(self, obj, dst: int = 0) -> list | None:
        """Every rank's ``obj`` in rank order on rank ``dst``, None elsewhere."""
        return self.world.ranks.gather_object(obj, dst)

    def stage_state_dicts(self, cpu: bool = True, replica: int | None = None) -> dict[int, dict[str, Tensor]]:
        """{stage index: state_dict} of this process's stages of ``replica`` (default: its first)."""
        self.complete_steps()
        rep = self.replicas[0] if replica is None else next(r for r in self.replicas if r.index == replica)
        return {
            j: {k: (v.detach().cpu() if cpu else v) for k, v in rep.model[j].state_dict().items()} for j in self.stages
        }

    def gather_state_dict(self, dst: int = 0) -> dict[str, Tensor] | None:
        """Replica 0's whole model state_dict (keys as ``model.state_dict()``) on rank ``dst``. In
        one process: the live tensors (copy before changing the model); across ranks: CPU copies."""
        self.complete_steps()
        if self.world_size == 1:
            return self.model.state_dict()
        parts = self.gather_object(self.stage_state_dicts() if 0 in self.world.placement.replicas else {}, dst)
        if parts is None:
            return None
        merged = {j: sd for part in parts for j, sd in part.items()}
        return {f"{j}.{k}": v for j in range(len(self.model)) for k, v in merged[j].items()}

    def gather_replica_states(self, dst: int = 0) -> list[dict[str, Tensor]] | None:
        """Every replica's whole model state_dict, in replica order, on rank ``dst`` (CPU copies
        across ranks; in one process the live tensors)."""
        self.complete_steps()
        if self.world_size == 1:
            return [rep.model.state_dict() for rep in self.replicas]
        mine = {rep.index: self.stage_state_dicts(replica=rep.index) for rep in self.replicas}
        parts = self.gather_object(mine, dst)
        if parts is None:
            return None
        merged: dict[int, dict[int, dict]] = {}
        for part in parts:
            for r, stages in part.items():
                merged.setdefault(r, {}).update(stages)
        return [
            {f"{j}.{k}": v for j in range(len(self.model)) for k, v in merged[r][j].items()} for r in sorted(merged)
        ]

    def _groups(self) -> list:
        """This process's replica groups, each once, in stage order."""
        return list({id(g): g for g in (self.world.groups.replica_group(j) for j in self.stages)}.values())

    def floats_sent(self) -> int:
        """Floats this process's replica groups have put into collectives in the run (checkpointed)."""
        return sum(g.floats_sent for g in self._groups())

    # ---- checkpointing ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This process's in-flight pipeline at a tick boundary: its workers' state (storage
        records, gradients, optimizer and scheduler), by replica and stage, and the messages sent to
        its stages but not yet consumed. Weights and buffers are saved separately. Every rank calls
        it at the same tick."""
        from .placement import format_placement

        self.complete_steps()
        mesh = self.world.placement.mesh
        return {
            "tick": self.tick,
            "rank": self.rank,
            "mesh": [mesh.replicas, mesh.positions],
            "placement": format_placement(self.placement),
            "replicas": {rep.index: {w.index: w.state_dict() for w in rep.workers} for rep in self.replicas},
            "rule": self.rule.state_dict(),
            "world": self.world.transport.state_dict(),
            "floats_sent": [g.floats_sent for g in self._groups()],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` on a fresh pipeline (after loading the stages' weights)."""
        from .placement import format_placement

        state = _upgrade(state, format_placement(self.placement))
        mesh = self.world.placement.mesh
        if (tuple(state["mesh"]), state["rank"]) != ((mesh.replicas, mesh.positions), self.rank):
            raise ValueError(
                f"checkpoint of rank {state['rank']} of a {state['mesh'][0]}x{state['mesh'][1]} mesh "
                f"(replicas x pipeline positions) cannot be loaded on rank {self.rank} of {mesh}"
            )
        if state["placement"] != format_placement(self.placement):
            raise ValueError(
                f"checkpoint placement {state['placement']} differs from this run's {format_placement(self.placement)}"
            )
        self.tick = state["tick"]
        for rep in self.replicas:
            for worker in rep.workers:
                worker.load_state_dict(state["replicas"][rep.index][worker.index])
        self.rule.load_state_dict(state.get("rule", {}))
        self.rule.to(self.workers[0].device)
        self.world.transport.load_state_dict(state["world"])
        for group, count in zip(self._groups(), state.get("floats_sent", [])):
            group.floats_sent = count


def _upgrade(state: dict, placement: str) -> dict:
    """A pipeline state written by an older petra, in today's layout (one replica)."""
    if "transport" in state:  # petra 0.1's simulator
        state = {
            **state,
            "world": state["transport"],
            "workers": dict(enumerate(state["workers"])),
            "rank": 0,
            "world_size": 1,
            "placement": placement,
        }
    if "replicas" not in state:  # before the mesh: one replica, a pipeline of world_size ranks
        state = {**state, "mesh": [1, state["world_size"]], "replicas": {0: state["workers"]}}
    return state
