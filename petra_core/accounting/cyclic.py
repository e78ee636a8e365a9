"""Cyclic execution measured: what R replicas hold and exchange at every time slot, and how many
devices they need, in lockstep (DP) and with each replica started one slot after the previous
one (Cyclic Data Parallelism).

A *time slot* is a tick of the engine: one stage's forward or backward (the head does both in
one). :func:`cyclic_profile` runs the simulator and, at the end of every tick, reads the bytes
every stage copy's storage policy keeps (``kept_bytes()``: the activations held between forward
and backward) summed over the replicas; the gradient bytes the copies have ready to send in
that tick (a copy's accumulated gradient, when its backward completes the step: what a worker
puts on the wire as soon as it has it); and the bytes that enter an all-reduce launched in that
tick (:class:`CountingGroups`, the replica groups of the simulator's world; the engine launches
a stage's exchange once every replica has given its part). :func:`devices_needed` counts, from
the schedule alone, how many (replica, stage) cells are ever active at once on each stage: cells
never active together can share a device. :func:`check_assignment` verifies such an assignment
against the cells a run really activates, tick by tick.
"""

from __future__ import annotations

from collections import defaultdict

import pandas as pd

from ..engine import LocalWorld, Simulator
from ..engine.observers import Observer
from ..methods import get_method
from ..methods.schedule import Schedule
from ..run.runio import CYCLIC_FILES


class CountingGroups:
    """The replica groups of ``inner``, recording the gradient bytes each all-reduce takes in, by
    tick (``tick``: the one running, set by the caller)."""

    def __init__(self, inner):
        self.inner, self.tick = inner, 0
        self.exchanged: dict[int, int] = defaultdict(int)  # tick -> bytes entering the all-reduce

    def replica_group(self, stage: int) -> CountingGroup:
        return CountingGroup(self.inner.replica_group(stage), self)


class CountingGroup:
    """A local replica group that records the gradient bytes it all-reduces, by tick."""

    overlaps = False

    def __init__(self, inner, counts: CountingGroups):
        self.inner, self.counts = inner, counts
        self.size, self.local = inner.size, inner.local

    def all_reduce_mean(self, tensors):
        self.counts.exchanged[self.counts.tick] += sum(t.numel() * t.element_size() for t in tensors)
        return self.inner.all_reduce_mean(tensors)


class ActiveCells(Observer):
    """The (tick, replica, stage) of every forward and backward a run performs, and the gradient
    bytes each copy has ready to send when its backward completes a step's accumulation."""

    def __init__(self, pipe):
        self.pipe, self.cells = pipe, set()
        self.per_tick: dict[int, int] = defaultdict(int)  # tick -> cells active in it
        self.given: dict[int, int] = defaultdict(int)  # tick -> gradient bytes ready to send

    def before(self, phase, worker, mb):
        cell = (self.pipe.tick, worker.replica, worker.index)
        if phase in ("forward", "backward") and cell not in self.cells:
            self.cells.add(cell)
            self.per_tick[cell[0]] += 1

    def after(self, phase, worker, mb):
        if phase == "backward" and worker.step_due:
            self.given[self.pipe.tick] += sum(p.numel() * p.element_size() for p in worker.params)


def cyclic_profile(
    model, method: str, rule, *, replicas: int, offset: int, batches, batch_size: int, recipe=None
) -> tuple[pd.DataFrame, set]:
    """Per tick: activation bytes held by all copies, gradient bytes exchanged, active cells; and
    the set of active (tick, replica, stage) cells. ``batches``: the stream (replicas × steps)."""
    from ..optim import Recipe

    world = LocalWorld(replicas=replicas)
    world.groups = counting = CountingGroups(world.groups)
    sim = Simulator(
        model,
        method,
        num_batches=len(batches) // replicas,
        get_batch=batches.__getitem__,
        batch_size=batch_size,
        recipe=recipe or Recipe(),
        replicas=replicas,
        rule=rule,
        offset=offset,
        world=world,
    )
    active = ActiveCells(sim)
    sim.observers.append(active)
    rows = []
    while not sim.done:
        tick = counting.tick = sim.tick
        sim.advance()
        held = sum(sum(w.storage.kept_bytes().values()) for rep in sim.replicas for w in rep.workers)
        rows.append(
            {
                "tick": tick,
                "activation_bytes": held,
                "grad_bytes": active.given.get(tick, 0),
                "allreduce_bytes": counting.exchanged.get(tick, 0),
                "active_cells": active.per_tick.get(tick, 0),
            }
        )
    return pd.DataFrame(rows), active.cells


def uniform_offset(schedule: Schedule, replicas: int) -> int:
    """The offset that spreads R replicas evenly over one step (CDP's uniform delay)."""
    return schedule.period // replicas


def steady_window(schedule: Schedule, replicas: int, offset: int) -> range:
    """One step's ticks once every replica runs (after the fill): the window a profile is read in."""
    start = offset * (replicas - 1) + schedule.period
    return range(start, start + schedule.period)


def summarize(frame: pd.DataFrame, window: range) -> dict:
    """Peak and mean, over ``window``, of the activation and gradient bytes per tick."""
    w = frame[frame.tick.isin(list(window))]
    return {
        "activation_peak": int(w.activation_bytes.max()),
        "activation_mean": float(w.activation_bytes.mean()),
        "grad_peak": int(w.grad_bytes.max()),
        "grad_mean": float(w.grad_bytes.mean()),
        "grad_slots_busy": int((w.grad_bytes > 0).sum()),
        "slots": len(w),
    }


def devices_needed(schedule: Schedule, replicas: int, offset: int) -> dict:
    """From the schedule alone: for each stage, the most replicas that ever run it in one tick (the
    devices it needs, as cells never active together can share one), their sum, and an
    assignment ``{(replica, stage): device}`` (greedy colouring of the cells active together)."""
    J = schedule.num_stages
    ticks = schedule.num_ticks + offset * (replicas - 1)
    together: dict[int, list[list[int]]] = {j: [] for j in range(J)}
    for t in range(ticks):
        for j in range(J):
            running = [
                r
                for r in range(replicas)
                if 0 <= t - offset * r < schedule.num_ticks and schedule.action(t - offset * r, j).busy
            ]
            if running:
                together[j].append(running)
    per_stage = [max((len(g) for g in together[j]), default=0) for j in range(J)]
    assignment, next_device = {}, 0
    for j in range(J):
        conflicts = defaultdict(set)
        for g in together[j]:
            for r in g:
                conflicts[r] |= set(g) - {r}
        colour: dict[int, int] = {}
        for r in range(replicas):
            used = {colour[q] for q in conflicts[r] if q in colour}
            colour[r] = min(c for c in range(replicas) if c not in used)
        for r in range(replicas):
            assignment[r, j] = next_device + colour[r]
        next_device += max(colour.values()) + 1
    return {"per_stage": per_stage, "total": next_device, "dp_total": replicas * J, "assignment": assignment}


def check_assignment(cells: set, assignment: dict) -> list[tuple[int, int]]:
    """(tick, device) pairs where a run's active cells put two cells on one device (none is right)."""
    busy = defaultdict(int)
    for tick, replica, stage in cells:
        busy[tick, assignment[replica, stage]] += 1
    return sorted(key for key, n in busy.items() if n > 1)


# ---- the measurement the report renders (``petra cyclic``) -------------------------------------------
DEFAULTS = {
    "archs": ["resnet18", "revnet18"],
    "width": 8,
    "batch": 16,
    "image_size": 32,
    "replicas": 4,
    "groups": 4,
    "steps": 4,
    "seed": 0,
}


def variants(schedule: Schedule, replicas: int) -> list[tuple[str, str, int]]:
    """(label, rule, offset): DP in lockstep, CDP2 one slot apart, CDP2 spread evenly over a step."""
    return [
        ("DP", "dp", 0),
        ("CDP2, offset 1", "cdp2", 1),
        (f"CDP2, offset {uniform_offset(schedule, replicas)}", "cdp2", uniform_offset(schedule, replicas)),
    ]


def measure(settings: dict | None = None) -> dict[str, pd.DataFrame | dict]:
    """Every model × variant of :data:`DEFAULTS` (or ``settings``): per-tick profiles, their peaks
    and means over one steady step, and the devices each needs (checked against the run)."""
    import torch

    from ..families import build_model
    from ..replicas import get_rule

    cfg = {**DEFAULTS, **(settings or {})}
    R = cfg["replicas"]
    profiles, rows = [], []
    for arch in cfg["archs"]:
        g = torch.Generator().manual_seed(cfg["seed"])
        size = cfg["image_size"]
        batches = [
            (torch.randn(cfg["batch"], 3, size, size, generator=g), torch.randint(0, 10, (cfg["batch"],), generator=g))
            for _ in range(R * cfg["steps"])
        ]
        torch.manual_seed(cfg["seed"])
        J = len(build_model(arch, num_classes=10, width=cfg["width"]))
        schedule = get_method("backprop").schedule(J, cfg["steps"])
        for label, rule, offset in variants(schedule, R):
            torch.manual_seed(cfg["seed"])
            model = build_model(arch, num_classes=10, width=cfg["width"])
            frame, cells = cyclic_profile(
                model,
                "backprop",
                get_rule(rule, stages=None if rule == "dp" else cfg["groups"]),
                replicas=R,
                offset=offset,
                batches=batches,
                batch_size=cfg["batch"],
            )
            window = steady_window(schedule, R, offset)
            devices = devices_needed(schedule, R, offset)
            clashes = check_assignment(cells, devices["assignment"])
            if clashes:
                raise RuntimeError(
                    f"{arch} {label}: the device assignment puts two cells on one device at {clashes[:3]}"
                )
            frame = frame.assign(
                arch=arch,
                variant=label,
                rule=rule,
                offset=offset,
                slot=frame.tick - window.start,
                in_window=frame.tick.isin(list(window)),
            )
            profiles.append(frame)
            s = summarize(frame, window)
            rows.append(
                {
                    "arch": arch,
                    "variant": label,
                    "rule": rule,
                    "offset": offset,
                    "replicas": R,
                    "stages": J,
                    **s,
                    "activation_peak_to_mean": s["activation_peak"] / s["activation_mean"],
                    "grad_peak_to_mean": s["grad_peak"] / s["grad_mean"] if s["grad_mean"] else float("nan"),
                    "devices": devices["total"],
                    "devices_dp": devices["dp_total"],
                    "devices_per_stage": " ".join(map(str, devices["per_stage"])),
                }
            )
    summary = pd.DataFrame(rows)
    for _arch, g in summary.groupby("arch"):
        dp = g[g.rule == "dp"].iloc[0]
        summary.loc[g.index, "activation_peak_vs_dp"] = g.activation_peak / dp.activation_peak
    return {
        "profile": pd.concat(profiles, ignore_index=True),
        "summary": summary,
        "info": {
            "settings": cfg,
            "slot": "one tick: one stage's forward or backward (the head does both)",
            "window": "one step once every replica runs",
        },
    }


def write(measured: dict, out_dir) -> list:
    """``cyclic_profile.csv``, ``cyclic_summary.csv`` and ``cyclic.json`` in ``out_dir`` (atomically)."""
    import json
    from pathlib import Path

    from ..run import runio

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in CYCLIC_FILES]
    runio.write_text(paths[0], measured["profile"].to_csv(index=False))
    runio.write_text(paths[1], measured["summary"].to_csv(index=False, float_format="%.6g"))
    runio.write_text(paths[2], json.dumps(runio.finite_json(measured["info"]), indent=2, sort_keys=True) + "\n")
    return paths
