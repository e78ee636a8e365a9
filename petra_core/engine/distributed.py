"""The distributed runtime: the same stage workers as the simulator, one process per rank.

Each rank owns a contiguous range of stages (``placement.py``), builds the same model from the
same seed, keeps its stages, and runs the schedule tick by tick with ``run_tick`` — exactly the
simulator's per-stage code. Only the transport differs: :class:`DistributedTransport` routes a
message to the rank owning its destination stage over torch.distributed point-to-point
operations (gloo on CPU, NCCL with one GPU per rank), or through a local FIFO when both stages
live on the same rank. Same seed and configuration give the simulator's weights bit for bit on
CPU.

Wire protocol, per message: a fixed-size int64 header (direction, minibatch, and for each of
the two tensor slots: presence, dtype, layout, shape) followed by one send per present tensor.
Forward slots are (activation, labels); backward slots are (grad, activation) — the activation
is present iff the receiving stage rebuilds its input from its output (PETRA). Each direction
of each pair of neighbouring ranks has its own process group, so a stream of messages is
matched in order and, on NCCL, sends and receives never queue behind each other.

A message sent at tick t is consumed at tick t + 1. Sends are non-blocking; a send's handle is
waited on two ticks later (flow control, and the tensor stays alive until then). At the start
of tick t a rank asks a background receiver thread (one per incoming edge) for every message
its remote neighbours send during tick t, so the transfer overlaps compute.

Failures: every wait is bounded (``timeout``, default 60 s; the process-group timeout is set to
the same value). A dead peer is usually detected at once (gloo: "connection closed by peer").
The first rank to see a failure writes a message naming the failed stage(s) to the
rendezvous store; a watchdog thread on every rank polls that key and exits the process
(status 1) with the same message, so all ranks stop within seconds of the first detection.

Launch: ``torchrun --nproc-per-node=N -m petra_core.engine.distributed ...`` (demo on random
data), or ``python -m petra_core.engine.distributed --spawn N ...`` (local processes on
127.0.0.1 without torchrun). See docs/distributed.md.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from ..methods import Method, get_method
from ..models import StagedModel
from ..optim import Recipe
from .messages import BackwardMsg, ForwardMsg
from .pipeline import GetBatch, build_workers, run_tick, schedule_for
from .placement import PlacementSpec, format_placement, format_stages, measure_stage_costs, parse_placement

FAILURE_KEY = "petra/failed"
DEFAULT_TIMEOUT = 60.0

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool)
_MAGIC = 0x5E7A
_MAX_DIMS = 6
_SLOT = 4 + _MAX_DIMS  # present, dtype, layout, ndim, dims
_HEADER = 3 + 2 * _SLOT  # magic, direction, minibatch, two slots
_FORWARD, _BACKWARD = 0, 1
_DIRECTION = {_FORWARD: "forward", _BACKWARD: "backward"}


class PipelineError(RuntimeError):
    """A rank of a distributed pipeline failed or lost a peer. The message names the stage(s)."""


class _ProtocolError(RuntimeError):
    """A message arrived that the schedule did not announce (a bug, or mismatched configurations)."""


# ---- wire format ---------------------------------------------------------------------------------
def _wire(t: Tensor | None) -> tuple[list[int], Tensor | None]:
    """Header slot and the dense tensor to send (channels-last activations travel as NHWC)."""
    if t is None:
        return [0] * _SLOT, None
    if t.dtype not in _DTYPES:
        raise TypeError(f"cannot send a tensor of dtype {t.dtype}")
    layout = 0
    if not t.is_contiguous():
        if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
            t, layout = t.permute(0, 2, 3, 1), 1  # a dense NHWC view: no copy
        else:
            t = t.contiguous()
    if t.dim() > _MAX_DIMS:
        raise ValueError(f"cannot send a tensor with {t.dim()} dimensions (at most {_MAX_DIMS})")
    shape = list(t.shape)
    return [1, _DTYPES.index(t.dtype), layout, len(shape), *shape, *[0] * (_MAX_DIMS - len(shape))], t


def _unwire(slot: Sequence[int], device: torch.device) -> tuple[Tensor, int] | None:
    """An empty tensor shaped like a header slot describes, and its layout flag."""
    if not slot[0]:
        return None
    ndim = slot[3]
    return torch.empty(list(slot[4:4 + ndim]), dtype=_DTYPES[slot[1]], device=device), slot[2]


def _restore_layout(t: Tensor, layout: int) -> Tensor:
    return t.permute(0, 3, 1, 2) if layout == 1 else t


# ---- small helpers -------------------------------------------------------------------------------
def _bounded(fn: Callable[[], object], seconds: float) -> object:
    """Run ``fn`` in a daemon thread; None if it does not finish in time or raises."""
    box: list = [None]

    def target():
        with contextlib.suppress(Exception):
            box[0] = fn()

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(seconds)
    return box[0]


def _default_store():
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - no store (single process, custom init): no shared failure key
        return None


def _short(err: BaseException) -> str:
    """First line of an error, without gloo's source location and advice."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|h|hpp):\d+\]\s*", "", text)
    text = text.split(". This is typically caused")[0]
    return text if len(text) < 300 else text[:297] + "..."


def _is_timeout(err: BaseException) -> bool:
    return isinstance(err, TimeoutError) or "timed out" in str(err).lower() or "timeout" in str(err).lower()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for local launches)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- process group -------------------------------------------------------------------------------
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


# ---- the transport -------------------------------------------------------------------------------
@dataclass
class TransportStats:
    """Seconds the main thread spent blocked receiving (``recv_wait_s``) and sending (posting +
    waiting for completion, ``send_s``); background receive time (overlapped with compute)."""

    recv_wait_s: float = 0.0
    send_s: float = 0.0
    background_recv_s: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0


@dataclass
class _Edge:
    direction: int  # _FORWARD or _BACKWARD: the direction of the messages
    src: int  # sending stage
    dst: int  # receiving stage
    peer: int  # the remote rank
    group: object  # process group of this direction of this pair of ranks


class _Receiver:
    """Receives, in a daemon thread, the messages of one incoming edge in the order requested."""

    def __init__(self, edge: _Edge, device: torch.device, stats: TransportStats):
        self.edge, self.device, self.stats = edge, device, stats
        self.requests: queue.Queue = queue.Queue()
        self.results: queue.Queue = queue.Queue()
        self.pending: deque[int] = deque()  # minibatches requested and not yet handed over
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.thread = threading.Thread(target=self._loop, daemon=True,
                                       name=f"petra-recv-{_DIRECTION[edge.direction]}-{edge.dst}")
        self.thread.start()

    def request(self, mb: int) -> None:
        self.pending.append(mb)
        self.requests.put(mb)

    def stop(self) -> None:
        self.requests.put(None)

    def _loop(self) -> None:
        if self.cuda:
            torch.cuda.set_device(self.device)
        while True:
            mb = self.requests.get()
            if mb is None:
                return
            try:
                with torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext():
                    self.results.put((mb, self._receive(mb), None))
            except BaseException as err:  # noqa: BLE001 - handed to the main thread
                self.results.put((mb, None, err))
                return

    def _receive(self, mb: int):
        e = self.edge
        header = torch.empty(_HEADER, dtype=torch.int64, device=self.device)
        dist.irecv(header, e.peer, group=e.group).wait()
        t0 = time.perf_counter()
        h = header.tolist()
        if h[0] != _MAGIC or h[1] != e.direction:
            raise _ProtocolError(f"corrupt message header from rank {e.peer}: {h[:3]}")
        if h[2] != mb:
            raise _ProtocolError(f"expected the {_DIRECTION[e.direction]} message of minibatch {mb}, got {h[2]}")
        slots = [_unwire(h[3:3 + _SLOT], self.device), _unwire(h[3 + _SLOT:], self.device)]
        works = [dist.irecv(s[0], e.peer, group=e.group) for s in slots if s is not None]
        for w in works:
            w.wait()
        tensors = [None if s is None else _restore_layout(*s) for s in slots]
        event = None
        if self.cuda:
            event = torch.cuda.Event()
            event.record(self.stream)
        self.stats.background_recv_s += time.perf_counter() - t0
        self.stats.bytes_received += sum(s[0].numel() * s[0].element_size() for s in slots if s is not None)
        self.stats.messages_received += 1
        a, b = tensors
        msg = ForwardMsg(mb, a, b) if e.direction == _FORWARD else BackwardMsg(mb, a, b)
        return msg, event


class DistributedTransport:
    """The four transport calls of ``run_tick`` over torch.distributed point-to-point operations.

    ``placement[r]`` is the range of stages rank r owns. Call :meth:`begin_tick` at the start of
    every tick (it posts this tick's receives and retires old sends) and :meth:`finish` after
    the last one.
    """

    def __init__(self, placement: Sequence[range], schedule, *, rank: int, device: torch.device,
                 timeout: float = DEFAULT_TIMEOUT, groups: dict | None = None, on_failure=None):
        self.placement, self.schedule, self.rank = list(placement), schedule, rank
        self.device, self.timeout = torch.device(device), timeout
        self.on_failure = on_failure or (lambda message: message)
        self.owner = {j: r for r, stages in enumerate(self.placement) for j in stages}
        self.mine = self.placement[rank]
        self.local: dict[tuple[int, int], deque] = {}
        self.stats = TransportStats()
        self.sends: deque = deque()  # (tick, edge, mb, works, tensors)
        self.tick = -1
        self.backend = dist.get_backend() if dist.is_initialized() else "gloo"
        groups = groups if groups is not None else edge_groups(len(self.placement), timeout)
        J, lo, hi = schedule.num_stages, self.mine.start, self.mine.stop - 1
        self.out: dict[int, _Edge] = {}  # by direction
        self.receivers: dict[int, _Receiver] = {}
        if hi + 1 < J:
            self.out[_FORWARD] = _Edge(_FORWARD, hi, hi + 1, rank + 1, groups[_FORWARD, rank])
            self.receivers[_BACKWARD] = _Receiver(
                _Edge(_BACKWARD, hi + 1, hi, rank + 1, groups[_BACKWARD, rank + 1]), self.device, self.stats)
        if lo > 0:
            self.out[_BACKWARD] = _Edge(_BACKWARD, lo, lo - 1, rank - 1, groups[_BACKWARD, rank])
            self.receivers[_FORWARD] = _Receiver(
                _Edge(_FORWARD, lo - 1, lo, rank - 1, groups[_FORWARD, rank - 1]), self.device, self.stats)

    # -- naming ---------------------------------------------------------------------------------
    def where(self, stage: int) -> str:
        return f"stage {stage} (rank {self.owner[stage]})"

    def _fail(self, message: str) -> PipelineError:
        return PipelineError(self.on_failure(message))

    # -- per tick -------------------------------------------------------------------------------
    def begin_tick(self, tick: int) -> None:
        """Retire sends of ticks <= tick - 2 and request the messages neighbours send in ``tick``."""
        self.tick = tick
        self._retire(lambda s: s[0] <= tick - 2)
        for direction, rx in self.receivers.items():
            action = self.schedule.action(tick, rx.edge.src)
            mb = action.forward if direction == _FORWARD else action.backward
            if mb is not None:
                rx.request(mb)

    def finish(self) -> None:
        """Wait for every send to complete and stop the receiver threads."""
        self._retire(lambda s: True)
        self.close()

    def close(self) -> None:
        for rx in self.receivers.values():
            rx.stop()

    # -- the four calls ---------------------------------------------------------------------------
    def send_forward(self, src: int, msg: ForwardMsg) -> None:
        self._send(_FORWARD, src, src + 1, msg.mb, msg.activation, msg.labels)

    def send_backward(self, src: int, msg: BackwardMsg) -> None:
        self._send(_BACKWARD, src, src - 1, msg.mb, msg.grad, msg.activation)

    def recv_forward(self, dst: int) -> ForwardMsg:
        return self._recv(_FORWARD, dst)

    def recv_backward(self, dst: int) -> BackwardMsg:
        return self._recv(_BACKWARD, dst)

    # -- internals ----------------------------------------------------------------------------------
    def _send(self, direction: int, src: int, dst: int, mb: int, a: Tensor | None, b: Tensor | None) -> None:
        if self.owner[dst] == self.rank:
            msg = ForwardMsg(mb, a, b) if direction == _FORWARD else BackwardMsg(mb, a, b)
            self.local.setdefault((direction, dst), deque()).append(msg)
            return
        t0 = time.perf_counter()
        edge = self.out[direction]
        (slot_a, wa), (slot_b, wb) = _wire(a), _wire(b)
        header = torch.tensor([_MAGIC, direction, mb, *slot_a, *slot_b], dtype=torch.int64).to(self.device)
        tensors = [header] + [t for t in (wa, wb) if t is not None]
        try:
            works = [dist.isend(t, edge.peer, group=edge.group) for t in tensors]
        except Exception as err:  # noqa: BLE001
            raise self._send_error(edge, mb, err) from err
        self.sends.append((self.tick, edge, mb, works, tensors))
        self.stats.bytes_sent += sum(t.numel() * t.element_size() for t in tensors[1:])
        self.stats.messages_sent += 1
        self.stats.send_s += time.perf_counter() - t0

    def _send_error(self, edge: _Edge, mb: int, err: BaseException) -> PipelineError:
        what = f"{self.where(edge.src)} was sending it the {_DIRECTION[edge.direction]} message of minibatch {mb}"
        if _is_timeout(err):
            return self._fail(f"petra: {self.where(edge.dst)} stopped responding: timed out after {self.timeout:g} s "
                              f"while {what} ({_short(err)})")
        return self._fail(f"petra: {self.where(edge.dst)} failed: connection lost while {what} ({_short(err)})")

    def _retire(self, due: Callable[[tuple], bool]) -> None:
        t0 = time.perf_counter()
        try:
            while self.sends and due(self.sends[0]):
                _, edge, mb, works, _ = self.sends[0]
                deadline = time.monotonic() + self.timeout
                try:
                    for w in works:
                        self._wait(w, deadline)
                except Exception as err:  # noqa: BLE001
                    raise self._send_error(edge, mb, err) from err
                self.sends.popleft()
        finally:
            self.stats.send_s += time.perf_counter() - t0

    def _wait(self, work, deadline: float) -> None:
        if self.backend == "gloo":  # gloo's is_completed() only turns true in wait(): wait with a timeout
            left = max(deadline - time.monotonic(), 0.001)
            work.wait(timeout=datetime.timedelta(seconds=left))
            return
        while not work.is_completed():
            if time.monotonic() > deadline:
                raise TimeoutError("send did not complete")
            time.sleep(0.0002)
        work.wait()

    def _recv(self, direction: int, dst: int):
        src = dst - 1 if direction == _FORWARD else dst + 1
        if self.owner[src] == self.rank:
            return self.local[(direction, dst)].popleft()
        rx = self.receivers[direction]
        t0 = time.perf_counter()
        try:
            mb, result, err = rx.results.get(timeout=self.timeout)
            rx.pending.popleft()
        except queue.Empty:
            mb = rx.pending[0] if rx.pending else "?"
            raise self._fail(
                f"petra: {self.where(src)} stopped responding: timed out after {self.timeout:g} s while "
                f"{self.where(dst)} was waiting for its {_DIRECTION[direction]} message of minibatch {mb}"
            ) from None
        finally:
            self.stats.recv_wait_s += time.perf_counter() - t0
        what = f"{self.where(dst)} was receiving its {_DIRECTION[direction]} message of minibatch {mb}"
        if err is not None:
            if isinstance(err, _ProtocolError):
                raise self._fail(f"petra: protocol error from {self.where(src)} while {what}: {err} "
                                 "(do all ranks run the same configuration and version?)") from err
            if _is_timeout(err):
                raise self._fail(f"petra: {self.where(src)} stopped responding: timed out after {self.timeout:g} s "
                                 f"while {what} ({_short(err)})") from err
            raise self._fail(f"petra: {self.where(src)} failed: connection lost while {what} ({_short(err)})") from err
        msg, event = result
        if event is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(event)
            for t in (msg.activation, msg.labels) if direction == _FORWARD else (msg.grad, msg.activation):
                if t is not None:
                    t.record_stream(stream)
        return msg


_GROUPS: dict = {}


def edge_groups(world_size: int, timeout: float = DEFAULT_TIMEOUT) -> dict[tuple[int, int], object]:
    """One process group per direction per pair of neighbouring ranks. Keys: (_FORWARD, r) for
    r -> r+1, (_BACKWARD, r) for r -> r-1. Collective the first time (every rank calls it, in the
    same order); cached for the current default process group after that."""
    world = dist.group.WORLD
    if _GROUPS.get("world") is not world or _GROUPS.get("key") != (world_size, timeout):
        groups = {}
        td = datetime.timedelta(seconds=timeout)
        for r in range(world_size - 1):
            groups[_FORWARD, r] = dist.new_group([r, r + 1], timeout=td)
            groups[_BACKWARD, r + 1] = dist.new_group([r, r + 1], timeout=td)
        _GROUPS.update(world=world, key=(world_size, timeout), groups=groups)
    return _GROUPS["groups"]


# ---- the pipeline -------------------------------------------------------------------------------
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
        self.failed: str | None = None
        self._store = _default_store()
        self._watchdog_stop = threading.Event()
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
            if placement == "balanced":
                costs = measure_stage_costs(model, sample if sample is not None else get_batch(0),
                                            method=self.method, device=self.device)
            box[0] = (parse_placement(placement, J, self.world_size, costs), costs)
        dist.broadcast_object_list(box, src=0, device=self._obj_device)
        self.placement, self.stage_costs = box[0]
        self.stages: range = self.placement[self.rank]

        for j in self.stages:
            model[j].to(self.device)
        self.workers = build_workers(
            model, self.method, k=k, recipe=recipe, batch_size=batch_size,
            batches_per_epoch=batches_per_epoch or max(num_batches, 1), stages=self.stages,
        )
        self.transport = DistributedTransport(self.placement, self.schedule, rank=self.rank, device=self.device,
                                              timeout=timeout, on_failure=self._report_failure)
        self._wall = 0.0
        self._tick_ends: list[float] = []
        dist.barrier(device_ids=[self.device.index] if self.device.type == "cuda" else None)
        if watchdog and self._store is not None and self.world_size > 1:
            threading.Thread(target=self._watch, daemon=True, name="petra-watchdog").start()

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

    def describe(self) -> str:
        return f"rank {self.rank} ({format_stages(self.stages)})"

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
                self.transport.finish()
                self._watchdog_stop.set()
            if self.sync_timing:
                torch.cuda.synchronize(self.device)
        except PipelineError:
            self._watchdog_stop.set()
            self.transport.close()
            raise
        except Exception as err:
            self._watchdog_stop.set()
            self.transport.close()
            where = f"stage {stage} (rank {self.rank})" if stage is not None else self.describe()
            raise PipelineError(self._report_failure(
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

    def gather_state_dict(self, dst: int = 0) -> dict[str, Tensor] | None:
        """The whole model's state_dict (keys as ``model.state_dict()``, CPU tensors) on rank
        ``dst``; None elsewhere. Collective: every rank must call it."""
        parts = [None] * self.world_size if self.rank == dst else None
        dist.gather_object(self.stage_state_dicts(), parts, dst=dst)
        if self.rank != dst:
            return None
        merged = {j: sd for part in parts for j, sd in part.items()}
        return {f"{j}.{k}": v for j in range(len(self.model)) for k, v in merged[j].items()}

    def gather_head_log(self, dst: int = 0) -> list[tuple[int, float, int, int]] | None:
        """The head's log on rank ``dst`` (collective)."""
        logs = [None] * self.world_size if self.rank == dst else None
        dist.gather_object(self.head_log, logs, dst=dst)
        return logs[-1] if self.rank == dst else None

    def gather_timings(self, dst: int = 0) -> list[RankTimings] | None:
        out = [None] * self.world_size if self.rank == dst else None
        dist.gather_object(self.timings(), out, dst=dst)
        return out

    def close(self) -> None:
        self._watchdog_stop.set()
        self.transport.close()

    # -- failures -------------------------------------------------------------------------------
    def _report_failure(self, message: str) -> str:
        """Publish the first failure to the store; returns the message to raise (with the root
        cause first when another rank reported one before)."""
        self.failed = message
        self._watchdog_stop.set()
        store = self._store
        first = None
        mine = f"{message} [seen by {self.describe()}]"
        if store is not None:
            first = _bounded(lambda: store.compare_set(FAILURE_KEY, "", mine).decode(), 5.0)
        if first and first != mine:  # another rank saw a failure first: lead with it (the root cause)
            return f"{first}\n  then on {self.describe()}: {message}"
        return message

    def _watch(self) -> None:
        store, poll = self._store, 0.5
        while not self._watchdog_stop.wait(poll):
            try:
                if not store.check([FAILURE_KEY]):
                    continue
                first = store.get(FAILURE_KEY).decode()
            except Exception:  # noqa: BLE001 - store gone (its host exited): rely on the connections
                return
            if self._watchdog_stop.is_set():
                return
            print(f"{first}\n  {self.describe()} stopping at tick {self.tick} because of it", file=sys.stderr,
                  flush=True)
            os._exit(1)


def fail(err: BaseException, code: int = 1) -> None:
    """Print a pipeline failure to stderr and end the process at once (no hanging in teardown)."""
    print(str(err) if isinstance(err, PipelineError) else f"petra: {type(err).__name__}: {err}",
          file=sys.stderr, flush=True)
    os._exit(code)


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


# ---- demo entry point ----------------------------------------------------------------------------
def synthetic_batch(seed: int, mb: int, batch: int, image_size: int, num_classes: int) -> tuple[Tensor, Tensor]:
    """Minibatch ``mb`` of random images and labels: a pure function of its arguments."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + mb)
    return (torch.randn(batch, 3, image_size, image_size, generator=g),
            torch.randint(0, num_classes, (batch,), generator=g))


def demo_setup(args: argparse.Namespace) -> tuple[StagedModel, GetBatch, Recipe]:
    """Model (seeded), data and recipe of the demo run; the tests rebuild the same for the simulator."""
    from ..models import build_model

    torch.manual_seed(args.seed)
    model = build_model(args.arch, num_classes=args.num_classes, width=args.width, stem=args.stem)

    def get_batch(mb: int):
        return synthetic_batch(args.seed, mb, args.batch, args.image_size, args.num_classes)

    recipe = Recipe(base_lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay, scale_lr=False)
    return model, get_batch, recipe


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m petra_core.engine.distributed",
        description="Distributed PETRA pipeline on random data (one process per rank). Launch with "
                    "torchrun --nproc-per-node=N, or with --spawn N for local processes.")
    p.add_argument("--arch", default="revnet18")
    p.add_argument("--width", type=int, default=16, help="base channel count (64 = the paper's models)")
    p.add_argument("--stem", default="cifar", choices=["cifar", "imagenet"])
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--method", default="petra", help="method, or several separated by commas (run in turn)")
    p.add_argument("--k", type=int, default=1, help="gradient accumulation")
    p.add_argument("--steps", type=int, default=20, help="minibatches to train on (optimizer steps when k = 1)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--placement", default="even", help="'even', 'balanced' (measured) or ranges '0-3,4-9'")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help="seconds before a silent peer is declared failed")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in each rank")
    p.add_argument("--save", default=None, help="rank 0 saves the gathered state_dict here ({method} is substituted)")
    p.add_argument("--json", default=None,
                   help="rank 0 writes throughput and per-rank timings here ({method} substituted)")
    p.add_argument("--warmup", type=int, default=1, help="minibatches excluded from the throughput (per end)")
    p.add_argument("--fault", default=None, metavar="RANK:TICK:KIND",
                   help="fault injection at the start of tick TICK on rank RANK: kill (SIGKILL itself), "
                        "exit (os._exit(3)) or hang (stop making progress)")
    p.add_argument("--spawn", type=int, default=0, metavar="N",
                   help="launch N local ranks on 127.0.0.1 (instead of torchrun) and wait for them")
    return p


def throughput(pipe: DistributedPipeline, timings: list[RankTimings], batch: int, warmup: int) -> dict:
    """Images/s over the whole run, and over the window where the pipeline is full (pipelined
    schedules: ticks 2(J-1) .. n; sequential: minibatches warmup .. n, whole periods)."""
    sch, n = pipe.schedule, pipe.schedule.num_batches
    total = max(t.wall_s for t in timings)
    out = {"images_per_s": n * batch / total if total > 0 else 0.0, "wall_s": total}
    if sch.kind == "pipelined":
        a, b = 2 * (sch.num_stages - 1), n
        count = b - a
    else:
        a, b = warmup * sch.period, sch.num_ticks
        count = n - warmup
    if count > 0 and a > 0:
        spans = [t.tick_ends[b - 1] - t.tick_ends[a - 1] for t in timings]
        out["steady_images_per_s"] = count * batch / max(spans)
        out["steady_window"] = f"ticks {a}-{b - 1}, {count} minibatches"
    return out


def _run_one(args, method: str, device: torch.device) -> None:
    model, get_batch, recipe = demo_setup(args)
    pipe = DistributedPipeline(model, method, num_batches=args.steps, get_batch=get_batch, batch_size=args.batch,
                               k=args.k, recipe=recipe, placement=args.placement, device=device,
                               timeout=args.timeout, sync_timing=device.type == "cuda")
    fault = None
    if args.fault:
        r, t, kind = args.fault.split(":")
        if kind not in ("kill", "exit", "hang"):
            raise ValueError(f"unknown fault kind {kind!r}; allowed: kill, exit, hang")
        fault = (int(t), kind) if int(r) == pipe.rank else None
    while not pipe.done:
        if fault is not None and pipe.tick == fault[0]:
            print(f"petra: fault injection: {fault[1]} on {pipe.describe()} at tick {pipe.tick}", file=sys.stderr,
                  flush=True)
            if fault[1] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif fault[1] == "exit":
                os._exit(3)
            while True:  # hang: the watchdog ends the process once a neighbour reports it
                time.sleep(1)
        pipe.step()
    sd, log, timings = pipe.gather_state_dict(), pipe.gather_head_log(), pipe.gather_timings()
    pipe.close()
    if pipe.rank != 0:
        return
    fmt = lambda s: s.replace("{method}", method)  # noqa: E731
    if args.save:
        torch.save(sd, fmt(args.save))
    tp = throughput(pipe, timings, args.batch, args.warmup)
    steady = ""
    if "steady_window" in tp:
        steady = f", steady {tp['steady_images_per_s']:.1f} images/s ({tp['steady_window']})"
    print(f"petra distributed: {method} {args.arch} width {args.width} batch {args.batch} on {pipe.world_size} "
          f"ranks ({device.type}), placement {format_placement(pipe.placement)}: {tp['images_per_s']:.1f} images/s"
          f"{steady}" + (f", last loss {log[-1][1]:.4f}" if log else ""), flush=True)
    for t in timings:
        print(f"  rank {t.rank} ({t.stages}): compute {t.compute_s:.2f} s, waiting {t.recv_wait_s:.2f} s, "
              f"send {t.send_s:.2f} s, background recv {t.background_recv_s:.2f} s, "
              f"sent {t.bytes_sent / 2**20:.1f} MiB", flush=True)
    if args.json:
        rows = [{k: v for k, v in asdict(t).items() if k != "tick_ends"} for t in timings]
        with open(fmt(args.json), "w") as f:
            json.dump({"method": method, "world_size": pipe.world_size, "device": device.type,
                       "placement": format_placement(pipe.placement), "stage_costs": pipe.stage_costs,
                       **tp, "ranks": rows, "losses": [l for _, l, _, _ in log]}, f, indent=1)


def launch_local(argv: Sequence[str], nprocs: int, *, timeout: float | None = None, env: dict | None = None,
                 capture: bool = False, module: str = "petra_core.engine.distributed") -> list[subprocess.Popen]:
    """Run ``python -m MODULE ARGV`` as ``nprocs`` ranks on 127.0.0.1 and wait for them.

    Like torchrun without its agent: this process hosts the rendezvous store (so it outlives any
    rank, as torchrun's does) and sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT;
    a failing rank is *not* killed by the launcher, the ranks stop each other. Processes still
    running after ``timeout`` seconds are killed. With ``capture`` each process gets ``.out`` and
    ``.err`` (its output); every process gets ``.ended`` (time.monotonic() when it exited).
    """
    store = dist.TCPStore("127.0.0.1", 0, nprocs, True, datetime.timedelta(seconds=max(timeout or 0, 600)),
                          wait_for_workers=False)
    procs = []
    for rank in range(nprocs):
        e = dict(os.environ, **(env or {}), RANK=str(rank), WORLD_SIZE=str(nprocs), LOCAL_RANK=str(rank),
                 LOCAL_WORLD_SIZE=str(nprocs), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
                 TORCHELASTIC_USE_AGENT_STORE="True")
        pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) if capture else {}
        procs.append(subprocess.Popen([sys.executable, "-m", module, *argv], env=e, **pipes))
    readers = []
    if capture:
        for p in procs:
            p.out, p.err = "", ""
            for name in ("out", "err"):
                def read(p=p, name=name):
                    setattr(p, name, getattr(p, "std" + name).read())

                readers.append(threading.Thread(target=read, daemon=True))
        for th in readers:
            th.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    live = list(procs)
    while live:
        for p in list(live):
            if p.poll() is not None:
                p.ended = time.monotonic()
                live.remove(p)
        if live and deadline is not None and time.monotonic() > deadline:
            for p in live:
                p.kill()
                p.wait()
                p.ended = time.monotonic()
            break
        time.sleep(0.02)
    for th in readers:
        th.join(10)
    del store
    return procs


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.spawn:
        argv = list(sys.argv[1:] if argv is None else argv)
        rest = [a for i, a in enumerate(argv)
                if not (a == "--spawn" or a.startswith("--spawn=") or (i > 0 and argv[i - 1] == "--spawn"))]
        procs = launch_local(rest, args.spawn)
        codes = [p.returncode for p in procs]
        return 0 if all(c == 0 for c in codes) else 1
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        device = init_distributed(None if args.device != "cpu" else "gloo", timeout=args.timeout,
                                  device=None if args.device == "auto" else args.device)
        for method in args.method.split(","):
            _run_one(args, method.strip(), device)
        dist.barrier()
        dist.destroy_process_group()
    except PipelineError as err:
        fail(err)
    except Exception as err:  # noqa: BLE001 - any other failure must not leave the other ranks waiting
        import traceback

        traceback.print_exc()
        rank = os.environ.get("RANK", "?")
        fail(PipelineError(f"petra: rank {rank} failed before or outside the pipeline: {type(err).__name__}: {err}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
