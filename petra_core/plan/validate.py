"""``petra plan validate``: the planner's predictions against real multi-process runs.

The grid (:func:`grid`): methods × J × link bandwidths on emulated devices (each stage's phases
padded to configured seconds, each message delayed by latency + bytes / bandwidth: the timing of J
devices and that link, with real tensors), plus real 2- and 3-rank gloo runs. Each point is
predicted by the event simulation from the SAME per-phase seconds and link the emulation is given,
and measured by :func:`petra_core.plan.measure.measure_point`; the harness prints predicted vs
measured per point, the mean and max relative error (emulated and real apart), and writes a JSON
record atomically.

What comes from where, per point: phase times: the emulation's configuration (emulated points) or
the run's own measured mean per phase (real points, a calibration: what is checked there is the
schedule, overlap and link model, as Calculon validates with measured op times); the engine's host
time per tick (``StageProfile.host_s``): the run's own, every point (its main thread's time outside
the phases and not blocked on a message or a collective: what no emulation pads, and what sets the
pace of tiny real stages), with each point's error without it beside (``device_only_error``); message bytes:
the model's accounting on the meta device where a model of J stages exists, else the bytes the run
sent (bytes are sizes, not times); link: the emulation's (emulated) or the cpu-box card's measured
loopback (real).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from .cluster import Link, PlanError, load_cluster
from .profile import BYTE_FIELDS, PHASES, DeviceProfile, StageProfile
from .simulate import predict

METHODS = ("backprop", "delayed", "dsp", "petra", "gpipe", "1f1b")
STAGES = (2, 4, 6, 10)
BANDWIDTHS = (1e7, 1e8)  # bytes/s: 10 and 100 MB/s
LATENCY = 5e-4
FLUSHED_K = 4  # microbatches per flush of GPipe and 1F1B
PHASE_MS = {"forward": 20.0, "rebuild": 20.0, "backward": 40.0, "step": 5.0}
SHAPE = (1.0, 1.25, 0.75)  # stage j's phases × SHAPE[j % 3]: unbalanced stages, the head lighter
# the real points' chain: stages that compute for milliseconds (as a real run's do), not the tiny
# emulated chain whose phases are padded anyway, with enough minibatches for a steady window
REAL = {"width": 32, "batch": 64, "minibatches": 200}


@dataclass(frozen=True)
class Point:
    """One grid point (``measure`` gets its :class:`EmulatedPoint`)."""

    method: str
    stages: int
    replicas: int = 1
    k: int = 1
    link: tuple[float, float] | None = None
    emulated: bool = True


def recomputes(method: str) -> bool:
    from ..methods import get_method

    m = get_method(method)
    return m.reversible.recomputes or m.other.recomputes


def phase_seconds(method: str, stages: int, phase_ms: dict[str, float] = PHASE_MS) -> dict[str, list[float]]:
    """The emulation's per-stage phase targets: ``phase_ms`` shaped by :data:`SHAPE`; no rebuild where
    the method keeps its graph (and never at the head, which builds its graph at once)."""
    out = {p: [] for p in PHASES}
    for j in range(stages):
        scale = SHAPE[j % len(SHAPE)] if j < stages - 1 else 0.5
        for p in PHASES:
            ms = phase_ms[p] if p != "rebuild" or (recomputes(method) and j < stages - 1) else 0.0
            out[p].append(ms * scale / 1e3)
    return out


def grid(
    methods: Sequence[str] = METHODS,
    stages: Sequence[int] = STAGES,
    bandwidths: Sequence[float] = BANDWIDTHS,
    latency: float = LATENCY,
    replicas: Sequence[int] = (1,),
    real_ranks: Sequence[int] = (2, 3),
) -> list[Point]:
    """The emulated points (methods × J × bandwidths × replicas), then the real ones (PETRA and
    backprop on ``real_ranks`` ranks, no emulation)."""
    points = [
        Point(m, J, r, FLUSHED_K if m in ("gpipe", "1f1b") else 1, (latency, bw))
        for r in replicas
        for bw in bandwidths
        for J in stages
        for m in methods
        if runs_on_chain(m, J)
    ]
    points += [
        Point(m, J, 1, 1, None, emulated=False)
        for J in real_ranks
        for m in ("backprop", "petra")
        if runs_on_chain(m, J)
    ]
    return points


def runs_on_chain(method: str, stages: int) -> bool:
    """Can the measured chain (stem, J − 2 reversible blocks, head: ``measure.chain_model``) run
    ``method`` at J? A method that rebuilds inputs needs a reversible block, so J >= 3; such
    points are left out of the grid."""
    from ..methods import METHODS

    return stages >= 3 or not METHODS[method].needs_reversible


def model_bytes(point: Point, arch: str, width: int, batch: int) -> list[dict] | None:
    """The bytes per stage of the model the point runs (``chain.chain_model``: J stages of the
    arch's parts on ``measure.IMAGE_SIZE`` images), from the accounting on the meta device."""
    import torch

    from .chain import IMAGE_SIZE, chain_model
    from .memory import raw_sizes, stage_bytes

    with torch.device("meta"):
        model = chain_model(point.stages, width)
    return stage_bytes(raw_sizes(model, batch=batch, image_size=IMAGE_SIZE), point.method, batch=batch)


def measured_bytes(result: dict, stages: int) -> list[tuple[int, int]]:
    """(forward, backward) bytes per stage from a measurement's ``message_bytes``: per edge j → j+1 a
    number (both directions together: split as sent) or ``{"forward": f, "backward": b}``; or
    ``{"forward": [...], "backward": [...]}`` per sending stage."""
    raw = result.get("message_bytes")
    out = [(0, 0)] * stages
    if isinstance(raw, dict) and "forward" in raw:
        fwd, bwd = list(raw["forward"]) + [0] * stages, list(raw.get("backward", [])) + [0] * stages
        return [(int(fwd[j]), int(bwd[j])) for j in range(stages)]
    if isinstance(raw, Sequence):
        out = [[0, 0] for _ in range(stages)]
        for j, edge in enumerate(raw[: stages - 1]):
            if isinstance(edge, dict):
                out[j][0] += int(edge.get("forward", 0))
                out[j + 1][1] += int(edge.get("backward", 0))
            else:  # a total per edge: the activation up and the gradient down, half each
                out[j][0] += int(edge) // 2
                out[j + 1][1] += int(edge) - int(edge) // 2
        return [tuple(x) for x in out]
    return out


def phase_lists(phases, stages: int) -> dict[str, list[float]]:
    """``{phase: [seconds per stage]}`` from that form or from one ``{phase: seconds}`` per stage
    (a phase a stage never ran: 0)."""
    if isinstance(phases, dict):
        return {p: [float(x) for x in phases.get(p, [])] + [0.0] * (stages - len(phases.get(p, []))) for p in PHASES}
    if isinstance(phases, Sequence) and len(phases) == stages and all(isinstance(x, dict) for x in phases):
        return {p: [float(x.get(p, 0.0)) for x in phases] for p in PHASES}
    raise PlanError(
        f"phase_seconds {phases!r}: allowed: {{phase: [seconds per stage]}} or one {{phase: seconds}} a stage"
    )


def profile_for(
    point: Point, phases: dict[str, list[float]], sizes, batch: int, arch: str, width: int, host=None
) -> DeviceProfile:
    """A profile of the point's J stages: ``phases`` (seconds per stage), ``sizes`` (bytes: rows of
    :func:`~petra_core.plan.memory.stage_bytes`, or (forward, backward) message bytes per stage) and
    ``host`` (the engine's seconds per tick a stage acts in; None: 0)."""
    phases = phase_lists(phases, point.stages)
    host = list(host) if host else [0.0] * point.stages
    stages = []
    for j in range(point.stages):
        times = {f"{p}_s": phases[p][j] for p in PHASES} | {"host_s": float(host[j])}
        if sizes and isinstance(sizes[j], dict):
            stages.append(StageProfile(**times, **{key: sizes[j][key] for key in BYTE_FIELDS}))
        else:
            fwd, bwd = sizes[j] if sizes else (0, 0)
            stages.append(StageProfile(**times, forward_message_bytes=fwd, backward_message_bytes=bwd))
    return DeviceProfile(arch, point.method, batch, tuple(stages), width=width, k=point.k,
                         provenance=dict(source="validate"))  # fmt: skip


def live_link(card: Link, result: dict) -> Link:
    """``card``'s link with the latency the run's messages paid on its critical path (send to held
    by the waiting main thread: header and payload, the receiver thread, the hand-over), less their
    time on the wire at the card's bandwidth; the card's latency if the run timed none."""
    delays = result.get("message_delays") or {}
    if not delays.get("waited"):
        return card
    sent = result.get("message_bytes") or {}
    sizes = [b for d in ("forward", "backward") for b in sent.get(d, []) if b]
    wire = statistics.fmean(sizes) / card.effective if sizes else 0.0
    latency = max(delays["latency_s"] - wire, card.latency_s)
    return Link(f"{card.name}, as the run's messages paid it", latency, card.bandwidth, card.efficiency)


def run_point(
    point: Point,
    measure: Callable,
    spec_type: type,
    *,
    arch: str,
    width: int,
    batch: int,
    minibatches: int,
    phase_ms,
    sized: bool = True,
) -> dict:
    """Measure one point (``measure(spec_type(...))``), then predict it from its configuration; the
    row of the record."""
    phases = phase_seconds(point.method, point.stages, phase_ms) if point.emulated else None
    spec = spec_type(
        method=point.method, stages=point.stages, replicas=point.replicas, batch=batch, k=point.k, arch=arch,
        width=width, minibatches=minibatches, phase_seconds=phases, link=point.link,
    )  # fmt: skip
    t0 = time.perf_counter()
    result = measure(spec)
    wall = time.perf_counter() - t0
    sizes = model_bytes(point, arch, width, batch) if sized else None
    bytes_from = "accounting" if sizes is not None else "measured"
    if sizes is None:
        sizes = measured_bytes(result, point.stages)
    if point.emulated:
        link = Link("emulated", point.link[0], point.link[1]) if point.link else None
    else:
        phases = result["phase_seconds"]
        link = live_link(load_cluster("cpu-box").intra, result)
    host = result.get("host_seconds")
    profile = profile_for(point, phases, sizes, batch, arch, width, host)
    pred = predict(profile, point.method, replicas=point.replicas, k=point.k, link=link)
    device_only = predict(profile_for(point, phases, sizes, batch, arch, width), point.method,
                          replicas=point.replicas, k=point.k, link=link).seconds_per_minibatch  # fmt: skip
    measured = float(result["seconds_per_minibatch"])

    def error(predicted: float) -> float:
        return predicted / measured - 1 if measured > 0 else math.nan

    row = dict(
        asdict(point), predicted_s=pred.seconds_per_minibatch, measured_s=measured,
        error=error(pred.seconds_per_minibatch), device_only_s=device_only, device_only_error=error(device_only),
        host_seconds=host, bytes_from=bytes_from, configured_phase_seconds=phases if point.emulated else None,
        measured_phase_seconds=result.get("phase_seconds"), padded_over=result.get("padded_over"),
        ranks=result.get("ranks"), width=width, batch=batch, minibatches=minibatches, wall_s=wall,
    )  # fmt: skip
    peaks = result.get("peak_bytes")
    if isinstance(sizes[0], dict) and peaks and all(p is not None for p in peaks):
        row["predicted_peak_bytes"] = pred.peak_bytes
        row["measured_peak_bytes"] = list(peaks)
        row["peak_error"] = max(abs(p / m - 1) for p, m in zip(pred.peak_bytes, peaks) if m)
    return row


def summarise(rows: list[dict]) -> dict:
    """Mean and max |error| of the emulated and of the real points."""
    out = {}
    for name, emulated in (("emulated", True), ("real", False)):
        errs = [abs(r["error"]) for r in rows if r["emulated"] is emulated and math.isfinite(r["error"])]
        if errs:
            out[name] = dict(points=len(errs), mean_abs_error=statistics.fmean(errs), max_abs_error=max(errs))
        device = [abs(r["device_only_error"]) for r in rows if r["emulated"] is emulated and "device_only_error" in r]
        device = [e for e in device if math.isfinite(e)]
        if errs and device:  # the same points predicted without the engine's host time per tick
            out[name] |= dict(
                device_only_mean_abs_error=statistics.fmean(device), device_only_max_abs_error=max(device)
            )
    peaks = [r["peak_error"] for r in rows if "peak_error" in r]
    if peaks:
        out["peak_memory"] = dict(points=len(peaks), max_abs_error=max(peaks))
    return out


def format_row(r: dict) -> str:
    link = "real" if not r["emulated"] else f"{r['link'][1] / 1e6:g} MB/s"
    return (
        f"{r['method']:<9} J={r['stages']:<2} R={r['replicas']} k={r['k']} {link:>11}  predicted "
        f"{1e3 * r['predicted_s']:8.1f} ms  measured {1e3 * r['measured_s']:8.1f} ms  error {100 * r['error']:+6.1f} %"
    )


def validate(
    points: Sequence[Point],
    measure: Callable | None = None,
    spec_type: type | None = None,
    *,
    arch: str = "revnet18",
    width: int = 4,
    batch: int = 8,
    minibatches: int = 40,
    phase_ms: dict[str, float] = PHASE_MS,
    real: dict | None = None,
    say: Callable[[str], None] = print,
) -> dict:
    """Measure and predict every point; the record (rows, summary, provenance). ``measure`` and
    ``spec_type`` default to :mod:`petra_core.plan.measure`'s ``measure_point`` and ``EmulatedPoint``;
    the predictions then take the messages' sizes from the accounting of the chain those runs train
    (``chain.py``), and from what another ``measure`` reports it sent otherwise. ``width``, ``batch``
    and ``minibatches`` size the emulated points' chain; ``real`` (over :data:`REAL`) the real ones'."""
    sized = measure is None  # the real runs: their model is known, so are its bytes
    if measure is None or spec_type is None:
        from . import measure as measuring

        measure, spec_type = measure or measuring.measure_point, spec_type or measuring.EmulatedPoint
    for p in points:
        if p.stages < 2 and p.emulated:
            raise PlanError(f"validate point {p}: needs J >= 2 stages")
    real = {**REAL, **(real or {})}
    rows = []
    for p in points:
        size = dict(width=width, batch=batch, minibatches=minibatches) if p.emulated else real
        row = run_point(p, measure, spec_type, arch=arch, phase_ms=phase_ms, sized=sized, **size)
        rows.append(row)
        say(format_row(row))
    summary = summarise(rows)
    for name, s in summary.items():
        if "mean_abs_error" in s:
            without = (
                f" (device time alone: mean {100 * s['device_only_mean_abs_error']:.1f} %, "
                f"max {100 * s['device_only_max_abs_error']:.1f} %)"
                if "device_only_mean_abs_error" in s
                else ""
            )
            say(
                f"{name}: {s['points']} points, mean |error| {100 * s['mean_abs_error']:.1f} %, "
                f"max {100 * s['max_abs_error']:.1f} %{without}"
            )
    from .profile import revision

    return dict(
        rows=rows, summary=summary,
        settings=dict(arch=arch, width=width, batch=batch, minibatches=minibatches, phase_ms=dict(phase_ms), real=real),
        provenance=dict(revision=revision(), date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        load_average=os.getloadavg(), cpus=os.cpu_count()),
    )  # fmt: skip
