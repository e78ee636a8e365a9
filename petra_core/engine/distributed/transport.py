"""Stage messages of a distributed run: between ranks over torch.distributed point-to-point
operations, between two stages of one rank through a local transport (composition).

Each direction of each pair of neighbouring ranks has its own process group, so every stream is
matched in order (and, on NCCL, sends and receives never queue behind each other). A message
sent at tick t is consumed at t + 1: sends are waited on two ticks later (flow control), and a
background receiver per incoming edge fetches this tick's messages while the rank computes. At a
tick boundary :meth:`DistributedTransport.settle` leaves nothing on the wire, so ``state_dict``
holds every message not yet consumed.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ...models import streams
from ..emulation import Link, LinkDelay
from ..messages import BackwardMsg, ForwardMsg
from ..worlds import LocalTransport
from .failures import AFTER_FAILURE, DEFAULT_TIMEOUT, PipelineError, ProtocolError, is_timeout, short
from .placement import RankPlacement
from .wire import (
    BACKWARD,
    DIRECTION,
    FORWARD,
    HEADER,
    MAGIC,
    SLOT,
    SLOTS,
    flatten,
    from_wire,
    make_message,
    message_fields,
    message_tensors,
    restore_layout,
    to_wire,
    unflatten,
)


@dataclass
class TransportStats:
    """Seconds the main thread spent blocked receiving (``recv_wait_s``) and sending (posting +
    waiting for completion, ``send_s``; of it, waiting for earlier sends to complete,
    ``send_wait_s``); background receive time (overlapped with compute)."""

    recv_wait_s: float = 0.0
    send_s: float = 0.0
    send_wait_s: float = 0.0
    background_recv_s: float = 0.0
    bytes_sent: int = 0
    bytes_sent_backward: int = 0  # of bytes_sent, what went to the previous stage (gradients, rebuilt inputs)
    bytes_received: int = 0
    # None, or {(event, direction, src, dst, mb): time.monotonic()} for event in sent (posted), arrived
    # (all received, before an emulated link's hold), asked (the main thread asks for it), taken (and
    # has it): what measures a live link's latency as the engine sees it (``plan/measure.py``)
    clock: dict | None = None

    def stamp(self, event: str, edge, mb: int) -> None:
        if self.clock is not None:
            self.clock[event, edge.direction, edge.src, edge.dst, mb] = time.monotonic()


@dataclass
class _Edge:
    direction: int  # FORWARD or BACKWARD: the direction of the messages
    src: int  # sending stage
    dst: int  # receiving stage
    peer: int  # the remote rank
    group: object  # process group of this direction of this pair of ranks


class _Receiver:
    """Receives the messages of one incoming edge, in the order requested, in a background thread
    (on a side stream on CUDA, with an event for the consumer to wait on)."""

    def __init__(
        self,
        edge: _Edge,
        device: torch.device,
        stats: TransportStats,
        timeout: float = DEFAULT_TIMEOUT,
        issue=contextlib.nullcontext(),
        link: Link | None = None,
    ):
        self.edge, self.device, self.stats, self.timeout = edge, device, stats, timeout
        self.delay = LinkDelay(link) if link is not None else None  # an emulated link (engine/emulation.py)
        self.issue = issue  # held while posting operations (NCCL: one thread at a time, DistributedTransport)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=f"petra-recv-{DIRECTION[edge.direction]}-{edge.dst}")
        self.pending: deque[tuple[int, Future]] = deque()  # requested and not yet handed over
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    @property
    def edge_name(self) -> str:
        e = self.edge
        return f"on the {DIRECTION[e.direction]} edge stage {e.src} -> stage {e.dst} from rank {e.peer}"

    def request(self, mb: int) -> None:
        self.pending.append((mb, self.pool.submit(self._receive, mb)))

    def stop(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _receive(self, mb: int):
        e = self.edge
        if self.stream is not None:
            torch.cuda.set_device(self.device)
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            header = torch.empty(HEADER, dtype=torch.int64, device=self.device)
            with self.issue:
                work = dist.irecv(header, e.peer, group=e.group)
            work.wait()  # gloo: blocks, bounded by the group's timeout; NCCL: only orders the stream
            t0 = time.perf_counter()
            arrived_at = time.monotonic()  # the message's sending began (an emulated link starts it then)
            if self.stream is not None:  # never block in tolist(): poll with a deadline
                arrived = torch.cuda.Event()
                arrived.record(self.stream)
                wait_for(arrived, self.timeout, f"the header of minibatch {mb} {self.edge_name}")
            h = header.tolist()
            if h[0] != MAGIC or h[1] != e.direction:
                raise ProtocolError(f"corrupt message header from rank {e.peer}: {h[:3]}")
            if h[2] != mb:
                raise ProtocolError(f"expected the {DIRECTION[e.direction]} message of minibatch {mb}, got {h[2]}")
            kinds = h[3:5]
            slots = [from_wire(h[5 + i * SLOT : 5 + (i + 1) * SLOT], self.device) for i in range(SLOTS)]
            slots = [s for s in slots if s is not None]
            if len(slots) != sum(kinds):
                raise ProtocolError(f"header from rank {e.peer} announces fields {kinds} but {len(slots)} tensors")
            with self.issue:
                works = [dist.irecv(s[0], e.peer, group=e.group) for s in slots]
            for work in works:
                work.wait()
            event = None
            if self.stream is not None:  # handed over complete: the consumer's stream never waits unbounded
                event = torch.cuda.Event()
                event.record(self.stream)
                wait_for(event, self.timeout, f"the tensors of minibatch {mb} {self.edge_name}")
        nbytes = sum(s[0].numel() * s[0].element_size() for s in slots)
        self.stats.stamp("arrived", e, mb)
        if self.delay is not None:
            self.delay.hold(arrived_at, nbytes)
        self.stats.background_recv_s += time.perf_counter() - t0
        self.stats.bytes_received += nbytes
        return make_message(e.direction, mb, *unflatten(kinds, [restore_layout(*s) for s in slots])), event


def wait_for(event, timeout: float, what: str, poll_s: float = 0.0002) -> None:
    """Wait until ``event`` (a CUDA event) has completed, at most ``timeout`` seconds, polling
    instead of blocking, so a peer that never sends cannot hang the thread forever (and, with it,
    the interpreter's exit, which joins every receiver thread)."""
    deadline = time.monotonic() + timeout
    while not event.query():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not arrive within {timeout:g} s")
        time.sleep(poll_s)


class DistributedTransport:
    """Sends and receives between the stages of this rank's replica (``placement``: this rank's cell
    of the mesh). Messages between two stages of this rank go through its own
    :class:`~petra_core.engine.worlds.LocalTransport`; those to other ranks over the edge ``groups``
    (:func:`edge_groups`, owned by the world). :meth:`begin_tick` posts a tick's receives and retires
    old sends; :meth:`finish` ends the run."""

    def __init__(
        self,
        placement: RankPlacement,
        schedule,
        *,
        groups: dict,
        timeout: float = DEFAULT_TIMEOUT,
        on_failure=None,
        left=None,
        backward: bool = True,
        issue=None,
        link: Link | None = None,
    ):
        self.schedule, self.position = schedule, placement.position
        self.local = LocalTransport(placement)
        self.mesh = placement.mesh
        rank_of = lambda p: self.mesh.rank(placement.replica, p)  # noqa: E731
        self.rank = placement.rank
        self.device, self.timeout = placement.device, timeout
        self.on_failure = on_failure or (lambda message: message)
        self.left = left or (lambda rank: None)  # why a rank left on its own (FailureWatch.left)
        self.rank_of = rank_of
        self.name_stage = placement.name_stage
        self.owner = {j: p for p, stages in enumerate(placement.ranges) for j in stages}
        self.mine = placement.stages
        self.stats = TransportStats()
        self.sends: deque = deque()  # (tick, edge, mb, works, tensors)
        self.tick = -1
        self.backend = dist.get_backend() if dist.is_initialized() else "gloo"
        # NCCL forbids issuing operations from several threads at once, even on independent
        # communicators of one device (NCCL's "Thread Safety"): the main thread's sends and each
        # receiver thread's receives are posted under one lock, the world's (``issue``, shared with
        # the replica axis' collectives), or one of its own; gloo is thread-safe: none
        if issue is None:
            issue = threading.Lock() if self.backend == "nccl" else contextlib.nullcontext()
        self.issue = issue
        J, lo, hi = schedule.num_stages, self.mine.start, self.mine.stop - 1
        rank, nxt, prev = self.rank, rank_of(self.position + 1), rank_of(self.position - 1)
        self.out: dict[int, _Edge] = {}  # by direction
        self.receivers: dict[int, _Receiver] = {}  # by direction
        if hi + 1 < J:
            self.out[FORWARD] = _Edge(FORWARD, hi, hi + 1, nxt, groups[FORWARD, rank])
        if hi + 1 < J and backward:
            self.receivers[BACKWARD] = _Receiver(
                _Edge(BACKWARD, hi + 1, hi, nxt, groups[BACKWARD, nxt]), self.device, self.stats, timeout, issue, link
            )
        if lo > 0:
            self.out[BACKWARD] = _Edge(BACKWARD, lo, lo - 1, prev, groups[BACKWARD, rank])
            self.receivers[FORWARD] = _Receiver(
                _Edge(FORWARD, lo - 1, lo, prev, groups[FORWARD, prev]), self.device, self.stats, timeout, issue, link
            )
        self.ready: dict[int, deque] = {direction: deque() for direction in self.receivers}  # received, unconsumed
        self._open(backward)

    def _open(self, backward: bool) -> None:
        """One token over every edge of this rank, from the main thread, before any receiver
        thread starts: NCCL creates a pair's communicator lazily, at its first operation, and
        creating them here, one after another, keeps that out of the threads that later use two
        communicators at once. Every rank takes its edges in the same global order (by the lower
        rank of the pair, then direction), so along a pipeline the pairs complete in turn."""
        edges = [(e, True) for d, e in self.out.items() if d == FORWARD or backward]
        edges += [(rx.edge, False) for rx in self.receivers.values()]
        token = torch.zeros(1, device=self.device)
        for edge, sending in sorted(edges, key=lambda x: (min(self.rank, x[0].peer), x[0].direction)):
            try:
                (dist.send if sending else dist.recv)(token, edge.peer, group=edge.group)
            except Exception as err:  # noqa: BLE001
                raise self._lost(edge.dst if sending else edge.src, "opening the pipeline's connections", err) from err
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # -- naming ---------------------------------------------------------------------------------
    def where(self, stage: int) -> str:
        return self.name_stage(stage, self.owner[stage])

    def _fail(self, message: str) -> PipelineError:
        return PipelineError(self.on_failure(message))

    # -- per tick -------------------------------------------------------------------------------
    def begin_tick(self, tick: int) -> None:
        """Retire sends of ticks <= tick - 2 and request the messages neighbours send in ``tick``."""
        self.tick = tick
        self._retire(lambda s: s[0] <= tick - 2)
        for direction, rx in self.receivers.items():
            for msg in self.schedule.action(tick, rx.edge.src).sends:  # what the neighbour sends now
                if msg.direction == DIRECTION[direction] and msg.peer == rx.edge.dst:
                    rx.request(msg.mb)

    def finish(self) -> None:
        """Wait for every send to complete and stop the receiver threads."""
        self._retire(lambda s: True)
        self.close()

    def close(self) -> None:
        for rx in self.receivers.values():
            rx.stop()

    # -- the four calls: to a stage of this rank through the local transport, else over the wire ----
    def send_forward(self, replica: int, src: int, msg: ForwardMsg) -> None:
        if src + 1 in self.mine:
            self.local.send_forward(replica, src, msg)
        else:
            self._send(FORWARD, src, src + 1, msg.mb, msg.activation, msg.labels)

    def send_backward(self, replica: int, src: int, msg: BackwardMsg) -> None:
        if src - 1 in self.mine:
            self.local.send_backward(replica, src, msg)
        else:
            self._send(BACKWARD, src, src - 1, msg.mb, msg.grad, msg.activation)

    def recv_forward(self, replica: int, dst: int) -> ForwardMsg:
        return self.local.recv_forward(replica, dst) if dst - 1 in self.mine else self._recv(FORWARD, dst)

    def recv_backward(self, replica: int, dst: int) -> BackwardMsg:
        return self.local.recv_backward(replica, dst) if dst + 1 in self.mine else self._recv(BACKWARD, dst)

    # -- internals ----------------------------------------------------------------------------------
    def _send(self, direction: int, src: int, dst: int, mb: int, a, b) -> None:
        t0 = time.perf_counter()
        edge = self.out[direction]
        kinds, flat = flatten((a, b))
        if self.backend == "nccl":  # host tensors (the labels, pinned) go to the GPU NCCL sends from
            flat = [t.to(self.device, non_blocking=True) if t.device.type == "cpu" else t for t in flat]
        wired = [to_wire(t) for t in flat] + [to_wire(None)] * (SLOTS - len(flat))
        header = torch.tensor(
            [MAGIC, direction, mb, *kinds, *[v for slot, _ in wired for v in slot]], dtype=torch.int64
        )
        if self.device.type == "cuda":  # from pinned memory: the copy does not wait for the GPU to drain
            header = header.pin_memory().to(self.device, non_blocking=True)
        tensors = [header] + [t for _, t in wired if t is not None]
        self.stats.stamp("sent", edge, mb)
        try:
            with self.issue:
                works = [dist.isend(t, edge.peer, group=edge.group) for t in tensors]
        except Exception as err:  # noqa: BLE001
            raise self._send_error(edge, mb, err) from err
        self.sends.append((self.tick, edge, mb, works, tensors))
        nbytes = sum(t.numel() * t.element_size() for t in tensors[1:])
        self.stats.bytes_sent += nbytes
        if direction == BACKWARD:
            self.stats.bytes_sent_backward += nbytes
        self.stats.send_s += time.perf_counter() - t0

    def _lost(self, peer: int, what: str, err: BaseException) -> PipelineError:
        """The neighbour owning stage ``peer`` stopped responding or failed while this rank did ``what``
        (or left on its own: then it is named as stopped, not failed)."""
        why = None if isinstance(err, ProtocolError) else self.left(self.rank_of(self.owner[peer]))
        if why == AFTER_FAILURE:
            return self._fail(f"petra: {self.where(peer)} stopped because of it, while {what}")
        if why is not None:
            return self._fail(f"petra: {self.where(peer)} had {why} and left while {what} ({short(err)})")
        if isinstance(err, ProtocolError):
            return self._fail(
                f"petra: protocol error from {self.where(peer)} while {what}: {err} "
                "(do all ranks run the same configuration and version?)"
            )
        if is_timeout(err):
            return self._fail(
                f"petra: {self.where(peer)} stopped responding: timed out after {self.timeout:g} s "
                f"while {what}" + (f" ({short(err)})" if str(err) else "")
            )
        return self._fail(f"petra: {self.where(peer)} failed: connection lost while {what} ({short(err)})")

    def _send_error(self, edge: _Edge, mb: int, err: BaseException) -> PipelineError:
        what = f"{self.where(edge.src)} was sending it the {DIRECTION[edge.direction]} message of minibatch {mb}"
        return self._lost(edge.dst, what, err)

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
            waited = time.perf_counter() - t0
            self.stats.send_s += waited
            self.stats.send_wait_s += waited

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
        if self.ready[direction]:  # received at a tick boundary (settle), or restored from a checkpoint
            return self.ready[direction].popleft()
        return self._take(direction)

    def _take(self, direction: int):
        """The oldest requested message of the incoming edge of ``direction`` (waits for it)."""
        rx = self.receivers[direction]
        mb, future = rx.pending[0]
        self.stats.stamp("asked", rx.edge, mb)
        t0 = time.perf_counter()
        try:
            msg, event = future.result(timeout=self.timeout)
        except BaseException as err:  # noqa: BLE001 - a timeout, or the receive's own failure
            what = (
                f"{self.where(rx.edge.dst)} was {'waiting for' if isinstance(err, TimeoutError) else 'receiving'}"
                f" its {DIRECTION[direction]} message of minibatch {mb}"
            )
            raise self._lost(rx.edge.src, what, err) from err
        finally:
            self.stats.recv_wait_s += time.perf_counter() - t0
        self.stats.stamp("taken", rx.edge, mb)
        rx.pending.popleft()
        if event is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(event)
            for t in message_tensors(msg):
                t.record_stream(stream)
        return msg

    # -- checkpointing ----------------------------------------------------------------------------
    def settle(self) -> None:
        """At a tick boundary: receive every message requested so far (all those the neighbours
        sent up to the last tick) into the local queues, and wait for every send to complete.
        Afterwards nothing addressed to or from this rank is in flight on the wire."""
        for direction, rx in self.receivers.items():
            while rx.pending:
                self.ready[direction].append(self._take(direction))
        self._retire(lambda s: True)

    def state_dict(self) -> dict:
        """The messages sent to this rank's stages and not yet consumed: ``local`` those between its
        own stages, ``ready`` those from other ranks (settles first: nothing is left on the wire)."""
        local = self.local.state_dict()
        self.settle()

        def pack(msgs):
            return [(m.mb, *(streams.apply(lambda t: t.detach().cpu(), f) for f in message_fields(m))) for m in msgs]

        return {"local": local, "ready": {direction: pack(q) for direction, q in self.ready.items() if q}}

    def load_state_dict(self, state: dict) -> None:
        """Restore the queues of :meth:`state_dict` (on a fresh transport, before the first tick)."""
        if any(rx.pending for rx in self.receivers.values()) or self.sends:
            raise RuntimeError("load_state_dict needs a transport with nothing in flight")
        self.local.load_state_dict(state["local"])

        def unpack(direction, msgs):
            return deque(
                make_message(direction, mb, *(streams.apply(lambda t: t.to(self.device), f) for f in (a, b)))
                for mb, a, b in msgs
            )

        for direction in self.ready:
            self.ready[direction] = unpack(direction, state["ready"].get(direction, []))
        unexpected = set(state["ready"]) - set(self.ready)
        if unexpected:
            raise ValueError(
                f"checkpoint holds messages for incoming edges {sorted(unexpected)} this rank lacks "
                "(another placement?)"
            )


def edge_groups(mesh, timeout: float = DEFAULT_TIMEOUT) -> dict[tuple[int, int], object]:
    """One process group per direction per pair of neighbouring ranks of each replica of ``mesh``.
    Keys: (FORWARD, g) for g -> g+1, (BACKWARD, g) for g -> g-1 (global ranks). Collective: every
    rank calls it, in the same order; the caller owns the groups (the distributed world)."""
    groups = {}
    td = datetime.timedelta(seconds=timeout)
    for replica in range(mesh.replicas):
        for p in range(mesh.positions - 1):
            g = mesh.rank(replica, p)
            groups[FORWARD, g] = dist.new_group([g, g + 1], timeout=td)
            groups[BACKWARD, g + 1] = dist.new_group([g, g + 1], timeout=td)
    return groups
