"""Emulated devices: a real multi-process pipeline timed as if each rank had its own device and link.

On a machine with fewer cores than ranks, a real run's timing is not that of J devices. Emulation
gives it that timing without changing a bit of what it computes:

* :class:`PhasePadding` (an observer) pads each compute phase of each stage (forward, rebuild,
  backward, step) with a sleep up to a target time, so a stage costs what the emulated device
  would take; the tensors are still computed, and the sleep releases the core to the other ranks.
  A phase that takes longer than its target is counted (``overran``): its emulated time is then
  the real one, and the emulation is only as good as the targets are generous.
* :class:`LinkDelay` holds each message on its edge until it would have crossed an emulated link:
  transfers serialise on the edge (first in, first out), each takes bytes / bandwidth, and arrives
  ``latency`` seconds after its transfer ends. The receiving rank's background receiver applies
  it (``DistributedTransport(link=...)``), so it overlaps computation as a real transfer does.
* :class:`RingDelay` holds each collective of the replica axis (``DistributedReplicaGroup(link=...)``)
  until a ring over that link would have finished it: R − 1 hops of bytes / R each for a
  reduce-scatter or an all-gather, twice that for an all-reduce, each hop paying the latency;
  collectives of one group serialise. The wait happens where the runtime completes the collective
  (right before the weights are needed), so the ring overlaps what runs meanwhile.

The planner (``petra_core/plan``) predicts these runs from the same targets and link, and checks
itself against them (``petra plan validate``).
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

from .observers import Observer

COMPUTE_PHASES = ("forward", "rebuild", "backward", "step")


@dataclass(frozen=True)
class Link:
    """An emulated link: ``latency`` seconds, ``bandwidth`` bytes per second."""

    latency: float
    bandwidth: float

    def __post_init__(self):
        if not (isinstance(self.latency, (int, float)) and math.isfinite(self.latency) and self.latency >= 0):
            raise ValueError(f"link latency={self.latency!r} is not allowed; allowed: seconds >= 0")
        if not (isinstance(self.bandwidth, (int, float)) and self.bandwidth > 0 and math.isfinite(self.bandwidth)):
            raise ValueError(f"link bandwidth={self.bandwidth!r} is not allowed; allowed: bytes/s > 0")

    def seconds(self, nbytes: int) -> float:
        """One message alone on the link: latency + bytes / bandwidth."""
        return self.latency + nbytes / self.bandwidth


class LinkDelay:
    """One edge's emulated link: when each message, arrived (sent) at ``arrival``, is delivered."""

    def __init__(self, link: Link):
        self.link = link
        self.free_at = -math.inf  # when the link finishes its current transfer
        self.lock = threading.Lock()

    def due(self, arrival: float, nbytes: int) -> float:
        with self.lock:
            start = max(arrival, self.free_at)
            self.free_at = start + nbytes / self.link.bandwidth
            return self.free_at + self.link.latency

    def hold(self, arrival: float, nbytes: int) -> None:
        """Sleep (in the receiving thread) until the message is due."""
        wait = self.due(arrival, nbytes) - time.monotonic()
        if wait > 0:
            time.sleep(wait)


class RingDelay:
    """One replica group's emulated ring: when each collective, posted at ``posted``, completes."""

    HOPS = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}  # × (R − 1) hops

    def __init__(self, link: Link, size: int):
        self.link, self.size = link, size
        self.free_at = -math.inf  # when the ring finishes its current collective
        self.lock = threading.Lock()

    def seconds(self, kind: str, nbytes: int) -> float:
        """A collective alone on the ring: HOPS × (R − 1) × (latency + bytes / R / bandwidth), where
        ``nbytes`` is one copy's whole tensor (what ``petra_core.plan`` charges the same ring)."""
        hops = self.HOPS[kind] * (self.size - 1)
        return hops * (self.link.latency + nbytes / self.size / self.link.bandwidth)

    def due(self, posted: float, kind: str, nbytes: int) -> float:
        with self.lock:
            self.free_at = max(posted, self.free_at) + self.seconds(kind, nbytes)
            return self.free_at

    def hold(self, due: float) -> None:
        """Sleep (in the waiting thread) until the collective is due."""
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)


def check_phase_seconds(phase_seconds: dict, num_stages: int) -> dict[str, tuple[float, ...]]:
    """``{phase: [seconds per stage]}`` for the compute phases, validated in one line; a phase not
    given is not padded."""
    if not isinstance(phase_seconds, dict):
        raise ValueError(
            f"phase_seconds={phase_seconds!r} is not allowed; allowed: a mapping phase -> seconds per stage"
        )
    out = {}
    for phase, values in phase_seconds.items():
        if phase not in COMPUTE_PHASES:
            raise ValueError(f"phase {phase!r} is not allowed; allowed: {', '.join(COMPUTE_PHASES)}")
        if not isinstance(values, (list, tuple)) or len(values) != num_stages:
            raise ValueError(f"phase_seconds[{phase!r}] must list one time per stage ({num_stages}), got {values!r}")
        if not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in values):
            raise ValueError(f"phase_seconds[{phase!r}]={values!r} is not allowed; allowed: seconds >= 0")
        out[phase] = tuple(float(v) for v in values)
    return out


class PhasePadding(Observer):
    """Pads every compute phase of every stage this process runs to its target (seconds), and
    measures what each phase took with its padding (``measured``: mean per stage and phase)."""

    def __init__(self, phase_seconds: dict, num_stages: int):
        self.targets = check_phase_seconds(phase_seconds, num_stages)
        self.started: dict[tuple[int, int, str], float] = {}
        self.total: dict[tuple[str, int], float] = defaultdict(float)
        self.count: dict[tuple[str, int], int] = defaultdict(int)
        self.overran = 0

    def before(self, phase: str, worker, mb: int | None) -> None:
        if phase in COMPUTE_PHASES:
            self.started[worker.replica, worker.index, phase] = time.perf_counter()

    def after(self, phase: str, worker, mb: int | None) -> None:
        if phase not in COMPUTE_PHASES:
            return
        start = self.started.pop((worker.replica, worker.index, phase))
        target = self.targets[phase][worker.index] if phase in self.targets else 0.0
        left = target - (time.perf_counter() - start)
        if left > 0:
            time.sleep(left)
        elif target > 0:
            self.overran += 1
        self.total[phase, worker.index] += time.perf_counter() - start
        self.count[phase, worker.index] += 1

    def measured(self) -> dict[str, dict[int, float]]:
        """Mean seconds of each phase per stage, padding included."""
        out: dict[str, dict[int, float]] = defaultdict(dict)
        for (phase, stage), total in self.total.items():
            out[phase][stage] = total / self.count[phase, stage]
        return dict(out)
