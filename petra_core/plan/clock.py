"""The clock of ``petra plan profile``: each stage's phases (forward, rebuild, backward, send, step)
per minibatch, on the host and on the device (moved here from ``benchmarks/phase_times.py``, which
re-exports it for the GPU benchmark).

The runner calls its observers around every phase of every stage (petra_core/engine/observers.py);
:class:`PhaseClock` marks the start and end of each. Two passes, in ticks of their own (observers
change how a stage's graph is kept, so timed ticks never carry them):

1. host pass: ``perf_counter`` around each phase: the host's time to run it (on a GPU, to enqueue
   its kernels, without waiting for them);
2. device pass: CUDA events on the stage's stream around each phase. An event pair alone times
   the span the stream takes, and a GPU that waits for the host would count each wait for a
   launch. So before each phase the stream is kept busy (``torch.cuda._sleep``) for longer than
   the host took to enqueue that phase in the host pass (1.5 × plus 0.2 ms): when the start event
   fires, the phase's kernels are all queued and run back to back, and the pair times the device's
   own work. (A phase that synchronises inside still counts the launches after its sync.)

On a CPU the device is the host: the device pass times each phase with ``perf_counter`` too.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch

from petra_core.engine.observers import Observer

AHEAD_FACTOR, AHEAD_S = 1.5, 2e-4  # the sleep before a phase: 1.5 × its host time + 0.2 ms


# ---- the CUDA-only part ---------------------------------------------------------------------------
def cuda_mark(device: torch.device) -> torch.cuda.Event:
    """A timing event recorded now on ``device``'s current stream."""
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(device))
    return event


def cuda_sleep(device: torch.device, seconds: float, cycles_per_s: float) -> None:
    """Keep ``device``'s current stream busy for about ``seconds`` (the host does not wait)."""
    with torch.cuda.device(device):
        torch.cuda._sleep(max(1, int(seconds * cycles_per_s)))


def sleep_cycles_per_s(device: torch.device, cycles: int = 10_000_000) -> float:
    """How many ``torch.cuda._sleep`` cycles the device spins per second (timed with events)."""
    cuda_sleep(device, 1.0, cycles)  # warm-up: the kernel's first launch
    start = cuda_mark(device)
    cuda_sleep(device, 1.0, cycles)
    end = cuda_mark(device)
    end.synchronize()
    return cycles / (start.elapsed_time(end) / 1e3)


# ---- the observer -------------------------------------------------------------------------------
class PhaseClock(Observer):
    """Marks the start and end of every (stage, phase). ``device=False``: host marks
    (``perf_counter``); ``device=True``: CUDA events on a GPU stage (``perf_counter`` on a CPU one),
    each phase preceded by a sleep of ``ahead_s[(stage, phase)]`` seconds on the stream."""

    def __init__(self, device: bool = False, ahead_s: dict | None = None, cycles_per_s: float = 0.0):
        self.device, self.ahead_s, self.cycles_per_s = device, ahead_s or {}, cycles_per_s
        self.open: dict = {}
        self.spans: list[tuple[tuple[int, str], object, object]] = []  # ((stage, phase), start, end)

    def _mark(self, worker):
        if self.device and worker.device.type == "cuda":
            return cuda_mark(worker.device)
        return time.perf_counter()

    def before(self, phase, worker, mb):
        key = (worker.index, phase)
        if self.device and worker.device.type == "cuda" and key in self.ahead_s:
            cuda_sleep(worker.device, self.ahead_s[key], self.cycles_per_s)
        self.open[worker.replica, key] = self._mark(worker)

    def after(self, phase, worker, mb):
        key = (worker.index, phase)
        self.spans.append((key, self.open.pop((worker.replica, key)), self._mark(worker)))

    def seconds(self) -> list[tuple[tuple[int, str], float]]:
        """Each span's seconds (waits for the device's events)."""
        out = []
        for key, start, end in self.spans:
            if isinstance(start, float):
                out.append((key, end - start))
            else:
                end.synchronize()
                out.append((key, start.elapsed_time(end) / 1e3))
        return out


def per_stage_ms(spans: list[tuple[tuple[int, str], float]], stages: int, minibatches: int) -> list[dict]:
    """``[{phase: ms per minibatch}]``, one dict per stage, phases in the order first seen."""
    total: dict[tuple[int, str], float] = defaultdict(float)
    for key, s in spans:
        total[key] += s
    out: list[dict] = [{} for _ in range(stages)]
    for (stage, phase), s in total.items():
        out[stage][phase] = 1e3 * s / minibatches
    return out


def stage_phase_times(pipe, ticks: int, minibatches: int) -> dict:
    """Run ``ticks`` ticks (``minibatches`` minibatches' worth) twice, observed: the host pass,
    then the device pass. Returns ``stage_host_ms`` and ``stage_device_ms``, each a list of
    ``{phase: ms per minibatch}`` per stage."""
    stages = len(pipe.model)
    host = PhaseClock()
    pipe.observers.append(host)
    try:
        pipe.run(ticks)
    finally:
        pipe.observers.remove(host)
    host_spans = host.seconds()
    ahead: dict[tuple[int, str], float] = defaultdict(float)
    for key, s in host_spans:
        ahead[key] = max(ahead[key], AHEAD_FACTOR * s + AHEAD_S)
    devices = {w.device for w in pipe.workers if w.device.type == "cuda"}
    rates = [sleep_cycles_per_s(d) for d in sorted(devices, key=str)]
    clock = PhaseClock(device=True, ahead_s=dict(ahead), cycles_per_s=max(rates, default=0.0))
    pipe.observers.append(clock)
    try:
        pipe.run(ticks)
    finally:
        pipe.observers.remove(clock)
    return {
        "stage_host_ms": per_stage_ms(host_spans, stages, minibatches),
        "stage_device_ms": per_stage_ms(clock.seconds(), stages, minibatches),
    }
