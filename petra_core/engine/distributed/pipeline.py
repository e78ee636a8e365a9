"""This rank's share of a distributed pipeline, and joining the process group.

Each rank owns a contiguous range of stages (``placement.py``), builds the same model from the
same seed, keeps its stages, and runs the schedule tick by tick with ``run_tick`` — exactly the
simulator's per-stage code; only the transport differs (``transport.py``). Same seed and
configuration give the simulator's weights bit for bit on CPU.
"""
from __future__ import annotations

import datetime
import hashlib
import os
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from ...methods import Method, get_method
from ...models import StagedModel
from ...optim import Recipe
from ..pipeline import GetBatch, build_workers, run_tick, schedule_for
from ..placement import PlacementSpec, format_placement, format_stages, measure_stage_costs, parse_placement
from .failures import DEFAULT_TIMEOUT, FailureWatch, PipelineError, _short
from .transport import DistributedTransport


def default_device(backend: str | None = None) -> torch.device:
    """``cuda:{LOCAL_RANK}`` when CUDA is available (and the backend is not gloo), else CPU."""
    if torch.cuda.is_available() and backend != "gloo":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device("cpu")


def init_distributed(backend: str | None = None, *, timeout: float = DEFAULT_TIMEOUT,
                     device: torch.device | str | None = None) -> torch.device:
    """Join the process group from the environment (torchrun's RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT, LOCAL_RANK) with a short timeout; returns this rank's device.

    ``backend`` defaults to NCCL when the device is a GPU, gloo otherwise. Does nothing but pick
    the device if the process group already exists.
    """
    if device is None:
        device = default_device(backend)
    device = torch.device(device)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = backend or ("nccl" if device.type == "cuda" else "gloo")
        kwargs = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout), **kwargs)
    return device


def model_fingerprint(model: torch.nn.Module) -> str:
    """SHA-1 of every parameter and buffer (ranks must build identical models)."""
    h = hashlib.sha1()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


@dataclass
class RankTimings:
    """Per-rank wall-clock breakdown of the ticks run so far (seconds)."""

    rank: int
    stages: str
    ticks: int
    wall_s: float
    compute_s: float
    recv_wait_s: float
    send_s: float
    background_recv_s: float
    bytes_sent: int
    bytes_received: int
    tick_ends: list[float] = field(default_factory=list, repr=False)  # perf_counter() at the end of each tick


class DistributedPipeline:
    """This rank's share of a distributed pipeline; steps like :class:`Simulator`.

    Every rank constructs it with the same arguments and an identical ``model`` (same seed); it
    keeps the stages ``placement`` gives this rank, moves them to ``device``, and runs them tick
    by tick. ``get_batch`` is only called on rank 0 (it owns stage 0); other ranks may pass None.
    The process group must exist (:func:`init_distributed`).

    ``placement``: ``"even"``, ``"balanced"`` (rank 0 times every stage on ``sample``, or on
    ``get_batch(0)``, and splits the measured costs) or explicit ranges (``"0-3,4-9"``). Rank 0's
    decision is broadcast, so every rank agrees.
    """

    def __init__(
        self,
        model: StagedModel,
        method: str | Method,
        *,
        num_batches: int,
        get_batch: GetBatch | None = None,
        batch_size: int,
        k: int = 1,
        recipe: Recipe = Recipe(),
        batches_per_epoch: float | None = None,
        placement: PlacementSpec = "even",
        device: torch.device | str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        sample: tuple[Tensor, Tensor] | None = None,
        watchdog: bool = True,
        check_same_model: bool = True,
        sync_timing: bool = False,
    ):
        if not dist.is_initialized():
            raise RuntimeError("DistributedPipeline needs a process group: call init_distributed() first")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.model, self.method = model, get_method(method)
        self.device = torch.device(device) if device is not None else default_device(dist.get_backend())
        self.timeout, self.sync_timing = timeout, sync_timing and self.device.type == "cuda"
        self.schedule = schedule_for(self.method, len(model), num_batches)
        self.tick = 0
        self.watch = FailureWatch(self.describe, lambda: self.tick)
        self._obj_device = self.device if dist.get_backend() == "nccl" else None
        J = len(model)
        if self.rank == 0 and get_batch is None:
            raise ValueError("rank 0 owns stage 0 and needs get_batch")
        self._user_get_batch = get_batch

        # every rank must run the same configuration on the same initial weights
        config = (model.arch if hasattr(model, "arch") else None, J, self.method.name, num_batches, k, batch_size,
                  model_fingerprint(model) if check_same_model else None)
        configs = [None] * self.world_size
        dist.all_gather_object(configs, config)
        if any(c != configs[0] for c in configs):
            diff = [r for r, c in enumerate(configs) if c != configs[0]]
            raise ValueError(f"ranks disagree on (arch, stages, method, minibatches, k, batch, weights): rank 0 has "
                             f"{configs[0][:-1]}, ranks {diff} differ (same seed on every rank?): "
                             + "; ".join(f"rank {r}: {configs[r][:-1]}" for r in diff))

        # placement: decided on rank 0, broadcast
        box: list = [None]
        if self.rank == 0:
            costs = None
            try:
                if placement == "balanced":
                    costs = measure_stage_costs(model, sample if sample is not None else get_batch(0),
                                                method=self.method, device=self.device)
                box[0] = (parse_placement(placement, J, self.world_size, costs), costs)
            except ValueError as err:  # a bad spec: every rank raises it, none waits for the others
                box[0] = str(err)
        dist.broadcast_object_list(box, src=0, device=self._obj_device)
        if isinstance(box[0], str):
            raise ValueError(box[0])
        self.placement, self.stage_costs = box[0]
        self.stages: range = self.placement[self.rank]

        for j in self.stages:
            model[j].to(self.device)
        self.workers = build_workers(
            model, self.method, k=k, recipe=recipe, batch_size=batch_size,
            batches_per_epoch=batches_per_epoch or max(num_batches, 1), stages=self.stages,
        )
        self.transport = DistributedTransport(self.placement, self.schedule, rank=self.rank, device=self.device,
                                              timeout=timeout, on_failure=self.report_failure)
        self._wall = 0.0
        self._tick_ends: list[float] = []
        dist.barrier(device_ids=[self.device.index] if self.device.type == "cuda" else None)
        if watchdog and self.world_size > 1:
            self.watch.start()

    # -- Simulator-like interface -----------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.tick >= self.schedule.num_ticks

    @property
    def owns_head(self) -> bool:
        return self.stages.stop == len(self.model)

    @property
    def head_log(self) -> list[tuple[int, float, int, int]]:
        """(minibatch, loss, correct, batch size) per minibatch; empty on ranks without the head."""
        return self.workers[-1].head_log if self.owns_head else []

    @property
    def failed(self) -> str | None:
        """The failure this rank reported, if any."""
        return self.watch.failed

    def describe(self) -> str:
        stages = getattr(self, "stages", None)
        return f"rank {self.rank}" + (f" ({format_stages(stages)})" if stages is not None else "")

    def report_failure(self, message: str) -> str:
        """Publish a failure to every rank (see :class:`FailureWatch`); returns the message to raise."""
        return self.watch.report(message)

    def step(self) -> None:
        """Run one tick of this rank's stages (in order); flush partial accumulation after the last."""
        if self.done:
            return
        if self.failed is not None:
            raise PipelineError(self.failed)
        t0 = time.perf_counter()
        stage = None
        try:
            self.transport.begin_tick(self.tick)
            for worker in self.workers:
                stage = worker.index
                worker.stage.train()
                run_tick(worker, self.schedule.action(self.tick, worker.index), self.transport, self._get_batch)
            stage = None
            self.tick += 1
            if self.done:
                for worker in self.workers:
                    stage = worker.index
                    worker.step()  # flush a final partial accumulation group
                stage = None
                self.transport.finish()  # the watchdog keeps watching until close()
            if self.sync_timing:
                torch.cuda.synchronize(self.device)
        except PipelineError:
            self.watch.stop()
            self.transport.close()
            raise
        except Exception as err:
            self.transport.close()
            where = f"stage {stage} (rank {self.rank})" if stage is not None else self.describe()
            raise PipelineError(self.report_failure(
                f"petra: {where} failed at tick {self.tick}: {type(err).__name__}: {_short(err)}")) from err
        finally:
            t1 = time.perf_counter()
            self._wall += t1 - t0
            self._tick_ends.append(t1)

    def run(self, ticks: int | None = None) -> "DistributedPipeline":
        end = self.schedule.num_ticks if ticks is None else min(self.tick + ticks, self.schedule.num_ticks)
        while self.tick < end:
            self.step()
        return self

    def _get_batch(self, mb: int):
        x, labels = self._user_get_batch(mb)
        return x.to(self.device), labels.to(self.device)

    # -- results --------------------------------------------------------------------------------
    def timings(self) -> RankTimings:
        s = self.transport.stats
        return RankTimings(self.rank, format_stages(self.stages), self.tick, self._wall,
                           self._wall - s.recv_wait_s - s.send_s, s.recv_wait_s, s.send_s, s.background_recv_s,
                           s.bytes_sent, s.bytes_received, list(self._tick_ends))

    def stage_state_dicts(self, cpu: bool = True) -> dict[int, dict[str, Tensor]]:
        """{stage index: state_dict} of this rank's stages (save them per rank, or gather)."""
        return {j: {k: (v.detach().cpu() if cpu else v) for k, v in self.model[j].state_dict().items()}
                for j in self.stages}

    def gather_object(self, obj, dst: int = 0) -> list | None:
        """Every rank's ``obj`` (in rank order) on rank ``dst``, None elsewhere (collective)."""
        out = [None] * self.world_size if self.rank == dst else None
        dist.gather_object(obj, out, dst=dst)
        return out

    def gather_state_dict(self, dst: int = 0) -> dict[str, Tensor] | None:
        """The whole model's state_dict (keys as ``model.state_dict()``, CPU tensors) on rank
        ``dst``; None elsewhere. Collective: every rank must call it."""
        parts = self.gather_object(self.stage_state_dicts(), dst)
        if self.rank != dst:
            return None
        merged = {j: sd for part in parts for j, sd in part.items()}
        return {f"{j}.{k}": v for j in range(len(self.model)) for k, v in merged[j].items()}

    def gather_head_log(self, dst: int = 0) -> list[tuple[int, float, int, int]] | None:
        """The head's log on rank ``dst`` (collective)."""
        logs = self.gather_object(self.head_log, dst)
        return logs[-1] if self.rank == dst else None

    def gather_timings(self, dst: int = 0) -> list[RankTimings] | None:
        return self.gather_object(self.timings(), dst)

    # -- checkpointing ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's in-flight pipeline at a tick boundary: its workers' state (storage records,
        gradients, optimizer and scheduler) and the messages sent to it but not yet consumed
        (received first, so nothing is left on the wire). Its stages' weights and buffers are
        saved separately (:meth:`stage_state_dicts`). Every rank must call it at the same tick."""
        try:
            transport = self.transport.state_dict()
        except PipelineError:
            self.watch.stop()
            raise
        return {"tick": self.tick, "rank": self.rank, "world_size": self.world_size,
                "placement": format_placement(self.placement),
                "workers": {w.index: w.state_dict() for w in self.workers}, "transport": transport}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` on a fresh pipeline (after loading the stages' weights)."""
        if (state["world_size"], state["rank"]) != (self.world_size, self.rank):
            raise ValueError(f"checkpoint part of rank {state['rank']} of {state['world_size']} cannot be loaded "
                             f"on rank {self.rank} of {self.world_size}")
        if state["placement"] != format_placement(self.placement):
            raise ValueError(f"checkpoint placement {state['placement']} differs from this run's "
                             f"{format_placement(self.placement)}")
        self.tick = state["tick"]
        for worker in self.workers:
            worker.load_state_dict(state["workers"][worker.index])
        self.transport.load_state_dict(state["transport"])

    def close(self) -> None:
        self.watch.stop()
        self.transport.close()


@dataclass
class DistributedResult:
    placement: list[range]
    state_dict: dict[str, Tensor] | None  # on rank 0 when gathered
    head_log: list[tuple[int, float, int, int]] | None  # on rank 0 when gathered
    timings: list[RankTimings] | None  # every rank's, on rank 0
    pipeline: DistributedPipeline


def run_distributed(model: StagedModel, method: str | Method, *, num_batches: int, get_batch: GetBatch | None,
                    batch_size: int, k: int = 1, recipe: Recipe = Recipe(), batches_per_epoch: float | None = None,
                    placement: PlacementSpec = "even", device: torch.device | str | None = None,
                    timeout: float = DEFAULT_TIMEOUT, gather: bool = True, **kwargs) -> DistributedResult:
    """Train this rank's share of ``model`` for ``num_batches`` minibatches (pipeline drained,
    partial accumulation flushed). With ``gather``, rank 0 gets the full state_dict, the head's
    log and every rank's timings. Initialises the process group from the environment if needed.
    Raises :class:`PipelineError` on failure (call :func:`fail` to exit the process)."""
    device = init_distributed(timeout=timeout, device=device)
    pipe = DistributedPipeline(model, method, num_batches=num_batches, get_batch=get_batch, batch_size=batch_size,
                               k=k, recipe=recipe, batches_per_epoch=batches_per_epoch, placement=placement,
                               device=device, timeout=timeout, **kwargs)
    pipe.run()
    if not gather:
        return DistributedResult(pipe.placement, None, None, None, pipe)
    return DistributedResult(pipe.placement, pipe.gather_state_dict(), pipe.gather_head_log(),
                             pipe.gather_timings(), pipe)

