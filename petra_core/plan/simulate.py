"""The event simulation: a method's action table replayed on devices and links.

Each device runs the actions of the stages it holds in table order (tick by tick, stages in
order within a tick), as a rank of the distributed runtime does (``engine/pipeline.py``: no barrier
between ticks; a rank blocks only on the messages it receives). Within a stage's action, as
``run_stage_tick`` runs it:

* the forward starts when the device is free and the activation has arrived, takes the profile's
  forward time, and its activation leaves for the next stage's device;
* the backward starts when the device is free and the gradient has arrived (methods whose
  gradients cross stages), takes rebuild + backward, and its gradient leaves for the previous
  stage's device;
* the steps the table marks run at the end of the tick (one replica of a schedule whose weights
  stay fixed in flight, GPipe, 1F1B, backprop: at the flush, as the runner defers them), each
  after its replicas' all-reduce (a ring over the copies' devices: 2 (R − 1) latencies and
  2 (R − 1) / R of the gradient bytes at the slowest link's pace).

A message over a link takes latency + bytes / (bandwidth × efficiency); the transfers on one
directed link go one at a time (FIFO), and overlap compute (a device does not wait for its own
sends). Two stages on one device pass activations for free.

Steady state: the makespan of n₂ = 2 n₁ minibatches minus that of n₁, over n₁ (n₁: two groups of k
for a flushed schedule, which repeats from its first group; past 4J minibatches, a multiple of k,
for a pipelined one), which is exact for a periodic table.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from .cluster import LOCAL, Cluster, Link, PlanError
from .memory import device_peak_bytes
from .profile import DeviceProfile

LinkOf = Callable[[int, int], Link]


@dataclass(frozen=True)
class Layout:
    """Where a run's stage copies live: ``placement[p]`` = the stages of pipeline position p;
    replica r's position p is device ``r * P + p`` (a pipeline's stages on neighbouring devices)."""

    placement: tuple[range, ...]
    replicas: int = 1

    @property
    def positions(self) -> int:
        return len(self.placement)

    @property
    def devices(self) -> int:
        return self.positions * self.replicas

    def device(self, replica: int, position: int) -> int:
        return replica * self.positions + position

    def position_of(self) -> list[int]:
        """The pipeline position of each stage."""
        return [p for p, r in enumerate(self.placement) for _ in r]


def check_placement(placement: Sequence[range], num_stages: int) -> tuple[range, ...]:
    """Contiguous non-empty ranges covering stages 0..J−1 in order, or one line saying what is wrong."""
    expected = 0
    for r in placement:
        if r.step != 1 or len(r) == 0 or r.start != expected:
            raise PlanError(
                f"split {format_split(placement)} does not cover the model's {num_stages} stages in contiguous "
                f"non-empty ranges (the next range should start at stage {expected})"
            )
        expected = r.stop
    if expected != num_stages:
        raise PlanError(
            f"split {format_split(placement)} covers stages 0-{expected - 1}; the model has {num_stages} "
            f"(0-{num_stages - 1})"
        )
    return tuple(placement)


def parse_split(text: str, num_stages: int) -> tuple[range, ...]:
    """``"0-3,4-9"`` (inclusive ranges, a lone index for one stage) -> ranges, checked."""
    ranges = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            ranges.append(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise PlanError(f"split {text!r}: {part!r} is not a stage or an a-b range of stages") from None
    return check_placement(ranges, num_stages)


def format_split(placement: Sequence[range]) -> str:
    return ",".join(str(r.start) if len(r) == 1 else f"{r.start}-{r.stop - 1}" for r in placement)


def ring_allreduce_s(nbytes: float, replicas: int, link: Link) -> float:
    """A ring all-reduce of ``nbytes`` over ``replicas`` copies: 2 (R − 1) steps of bytes / R each."""
    if replicas == 1 or nbytes <= 0:
        return 0.0
    return 2 * (replicas - 1) * (link.latency_s + nbytes / replicas / link.effective)


def ring_allreduce_bytes(nbytes: float, replicas: int) -> float:
    """Bytes each copy sends in a ring all-reduce."""
    return 0.0 if replicas == 1 else 2 * (replicas - 1) / replicas * nbytes


@dataclass
class Timeline:
    """A simulated run: its makespan, per device the seconds computing, and bytes sent over links."""

    makespan: float
    busy: list[float]
    link_bytes: float
    allreduce_bytes: float


@lru_cache(maxsize=64)
def compiled_table(method: str, num_stages: int, minibatches: int, k: int) -> tuple:
    """The method's action table as tuples (flush, ((stage, forward, backward, step), ...)) per tick,
    read from ``Schedule.action`` once per (method, J, n, k): a search replays the same table on many
    layouts."""
    from ..methods import get_method

    sched = get_method(method).schedule(num_stages, minibatches, k=k)
    ticks = []
    for t in range(sched.num_ticks):
        acts = tuple((j, a.forward, a.backward, a.step) for j in sched.busy(t) for a in (sched.action(t, j),))
        ticks.append((sched.flushed(t), acts))
    return tuple(ticks)


def replay(
    profile: DeviceProfile, method: str, layout: Layout, link_of: LinkOf, *, k: int, minibatches: int
) -> Timeline:
    """Replay ``minibatches`` minibatches of ``method``'s table on ``layout``; replica 0 stands for all
    (they run the same table in lockstep, joined at every step by the all-reduce)."""
    from ..methods import get_method

    m = get_method(method)
    J, P, R = profile.num_stages, layout.positions, layout.replicas
    pos = layout.position_of()
    links = [[link_of(layout.device(0, a), layout.device(0, b)) for b in range(P)] for a in range(P)]
    rings = [layout_ring_link(layout, p, link_of) for p in range(P)]  # the link each position's all-reduce runs at
    fwd = [s.forward_s for s in profile.stages]
    bwd = [s.rebuild_s + s.backward_s for s in profile.stages]
    step = [s.step_s + ring_allreduce_s(s.grad_bytes, R, rings[pos[j]]) for j, s in enumerate(profile.stages)]
    reduce_bytes = [ring_allreduce_bytes(s.grad_bytes, R) for s in profile.stages]
    host = [s.host_s for s in profile.stages]  # per tick a stage acts in, before its first phase
    up = [s.forward_message_bytes for s in profile.stages]
    down = [s.backward_message_bytes for s in profile.stages]
    free = [0.0] * P
    busy = [0.0] * P
    waiting = [0.0] * P  # step seconds per device, waiting for the end of the tick (or the flush)
    link_free: dict[tuple[int, int], float] = defaultdict(float)
    arrival: dict[tuple[str, int, int], float] = {}
    sent = reduced = 0.0
    crosses = m.gradients_cross
    defer = m.schedule.fixed_weights_in_flight and R == 1

    def send(src: int, dst: int, t: float, nbytes: float, key) -> float:
        link = links[src][dst]
        if link is LOCAL or nbytes <= 0:
            arrival[key] = t
            return 0.0
        start = max(t, link_free[src, dst])
        wire = nbytes / link.effective
        link_free[src, dst] = start + wire
        arrival[key] = start + link.latency_s + wire
        return nbytes

    for flushed, actions in compiled_table(method, J, minibatches, k):
        for j, f, b, stepping in actions:
            d = pos[j]
            overhead = host[j]
            if f is not None:
                free[d] = max(free[d], arrival.pop(("f", f, j), 0.0)) + overhead + fwd[j]
                overhead = 0.0
                busy[d] += fwd[j]
                if j < J - 1:
                    sent += send(d, pos[j + 1], free[d], up[j], ("f", f, j + 1))
            if b is not None:
                ready = arrival.pop(("b", b, j), 0.0) if crosses and j < J - 1 else 0.0
                free[d] = max(free[d], ready) + overhead + bwd[j]
                overhead = 0.0
                busy[d] += bwd[j]
                if j > 0 and crosses:
                    sent += send(d, pos[j - 1], free[d], down[j], ("b", b, j - 1))
            free[d] += overhead  # a tick with only a step
            if stepping:
                waiting[d] += step[j]
                busy[d] += profile.stages[j].step_s
                reduced += reduce_bytes[j]
        if not defer or flushed:
            for d in range(P):
                free[d] += waiting[d]
                waiting[d] = 0.0
    return Timeline(max(free, default=0.0), busy, sent, reduced)


def layout_ring_link(layout: Layout, position: int, link_of: LinkOf) -> Link:
    """The slowest link of the ring joining a position's copies (LOCAL with one replica)."""
    devices = [layout.device(r, position) for r in range(layout.replicas)]
    pairs = [(a, b) for a, b in zip(devices, devices[1:] + devices[:1]) if a != b]
    return min((link_of(a, b) for a, b in pairs), key=lambda x: (x.effective, -x.latency_s), default=LOCAL)


@dataclass
class Prediction:
    """What the planner predicts for one configuration (seconds, bytes, fractions)."""

    method: str
    stages: int
    split: str
    devices: int
    replicas: int
    batch: int
    k: int
    seconds_per_minibatch: float
    one_device_seconds: float
    speedup: float
    bubble_fraction: float
    samples_per_s: float
    peak_bytes: list[int]
    memory_bytes: float | None
    fits: bool | None
    link_bytes_per_minibatch: float
    allreduce_bytes_per_step: float
    seconds_per_epoch: float | None = None
    minibatches_per_epoch: int | None = None
    provenance: dict = field(default_factory=dict)


def steady_seconds(profile: DeviceProfile, method: str, layout: Layout, link_of: LinkOf, k: int) -> tuple:
    """(seconds per minibatch at steady state, the two timelines and their minibatch counts)."""
    from ..methods import get_method

    J = profile.num_stages
    flushed = get_method(method).schedule.fixed_weights_in_flight  # periodic from the first group of k
    n1 = 2 * k if flushed else k * max(2, math.ceil(4 * J / k))
    n2 = 2 * n1
    a = replay(profile, method, layout, link_of, k=k, minibatches=n1)
    b = replay(profile, method, layout, link_of, k=k, minibatches=n2)
    return (b.makespan - a.makespan) / (n2 - n1), a, b, n1, n2


def predict(
    profile: DeviceProfile,
    method: str | None = None,
    *,
    placement: Sequence[range] | None = None,
    replicas: int = 1,
    k: int | None = None,
    cluster: Cluster | None = None,
    link: Link | None = None,
    minibatches_per_epoch: int | None = None,
    one_device_seconds: float | None = None,
) -> Prediction:
    """Predict one configuration: ``profile``'s stages split as ``placement`` (default: one stage a
    device) on ``replicas`` pipelines, on ``cluster``'s devices and links (or every pair of devices
    joined by ``link``; neither: free transfers). ``one_device_seconds``: the speedup's baseline, if
    known (a search computes it once)."""
    method = method or profile.method
    k = profile.k if k is None else k
    J = profile.num_stages
    placement = check_placement(placement or [range(j, j + 1) for j in range(J)], J)
    if not isinstance(replicas, int) or replicas < 1:
        raise PlanError(f"replicas is {replicas!r}; allowed: an integer >= 1")
    layout = Layout(placement, replicas)
    if cluster is not None and layout.devices > cluster.devices:
        raise PlanError(
            f"{layout.positions} devices x {replicas} replicas = {layout.devices} devices; "
            f"cluster {cluster.name!r} has {cluster.devices}"
        )
    if cluster is not None:
        link_of = cluster.link
    else:
        fixed = link or LOCAL
        link_of = lambda a, b: LOCAL if a == b else fixed  # noqa: E731
    t, _, b, _, n2 = steady_seconds(profile, method, layout, link_of, k)
    one = one_device_seconds or steady_seconds(profile, method, Layout((range(J),)), link_of, k)[0]
    work = sum(s.forward_s + s.rebuild_s + s.backward_s + s.step_s / k for s in profile.stages)
    peaks = device_peak_bytes(profile.stages, method, placement, k=k)
    memory = cluster.memory_bytes if cluster is not None else None
    epoch = None
    if minibatches_per_epoch:
        per_replica = math.ceil(minibatches_per_epoch / replicas)
        epoch = replay(profile, method, layout, link_of, k=k, minibatches=min(per_replica, n2)).makespan
        epoch += max(0, per_replica - n2) * t
    return Prediction(
        method=method,
        stages=J,
        split=format_split(placement),
        devices=layout.devices,
        replicas=replicas,
        batch=profile.batch,
        k=k,
        seconds_per_minibatch=t,
        one_device_seconds=one,
        speedup=one * replicas / t if t > 0 else math.inf,
        bubble_fraction=max(0.0, 1 - work / (layout.positions * t)) if t > 0 else 0.0,
        samples_per_s=profile.batch * replicas / t if t > 0 else math.inf,
        peak_bytes=peaks,
        memory_bytes=memory,
        fits=None if memory is None else max(peaks) <= memory,
        link_bytes_per_minibatch=b.link_bytes / n2,
        allreduce_bytes_per_step=b.allreduce_bytes / max(1, math.ceil(n2 / k)),
        seconds_per_epoch=epoch,
        minibatches_per_epoch=minibatches_per_epoch,
        provenance=dict(profile.provenance),
    )
