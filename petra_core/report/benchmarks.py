"""Benchmark records: what a benchmark measured, where, at which revision, on how busy a machine.

A benchmark run with ``--record`` writes ``results/benchmarks/<benchmark>-<variant>.json``
(:func:`record`): its result, the command, the code revision, torch, the CPU model and cores, and
the load average before and after (benchmarks need an idle machine: a record taken on a busy one
says so). README.md's "Benchmarks" block is rendered from these files by ``petra readme``
(:func:`benchmark_context`), never typed by hand.
"""
from __future__ import annotations

import datetime
import json
import os
import shlex
import sys
from pathlib import Path

BENCHMARK_RESULTS = "results/benchmarks"
BUSY = 0.5  # a 1-minute load average above this, before a benchmark, marks its record as taken on a busy machine


def _load_average() -> list[float] | None:
    return [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None


class Recorder:
    """Opened before a benchmark measures (the load average then), written after."""

    def __init__(self, benchmark: str, variant: str, root: str | Path = BENCHMARK_RESULTS):
        self.benchmark, self.variant, self.root = benchmark, variant, Path(root)
        self.load_before = _load_average()
        self.started = datetime.datetime.now(datetime.timezone.utc)

    @property
    def path(self) -> Path:
        return self.root / f"{self.benchmark}-{self.variant}.json"

    def write(self, result: dict) -> Path:
        import torch

        from ..run import runio

        self.root.mkdir(parents=True, exist_ok=True)
        runio.write_json(self.path, {
            "benchmark": self.benchmark, "variant": self.variant,
            "command": shlex.join(["python", *[os.path.relpath(a) if a.endswith(".py") else a for a in sys.argv]]),
            "measured_at": self.started.isoformat(timespec="seconds"), "git_revision": runio.git_revision(),
            "torch": torch.__version__, "cpu_model": runio.cpu_model(), "cpu_count": os.cpu_count(),
            "load_average_before": self.load_before, "load_average_after": _load_average(), "result": result})
        return self.path


def load(root: str | Path = BENCHMARK_RESULTS) -> dict[str, dict]:
    """Every record under ``root``, by file stem."""
    root = Path(root)
    if not root.is_dir():
        return {}
    return {p.stem: json.loads(p.read_text()) for p in sorted(root.glob("*.json"))}


def _where(rec: dict) -> dict:
    load = rec.get("load_average_before") or [0.0]
    revision = rec.get("git_revision") or "unknown"
    return {"cpu": rec.get("cpu_model"), "cores": rec.get("cpu_count"), "torch": rec.get("torch"),
            "revision": revision[:12] + ("-dirty" if revision.endswith("-dirty") else ""),
            "load": load[0], "busy": load[0] > BUSY, "command": rec.get("command"), "date": rec.get("measured_at", "")[:10]}


def benchmark_context(records: dict[str, dict]) -> dict:
    """What ``readme_benchmarks.md.j2`` shows: one entry per record, grouped by benchmark."""
    groups: dict[str, list] = {}
    for stem, rec in records.items():
        groups.setdefault(rec["benchmark"], []).append({"variant": rec["variant"], "result": rec["result"],
                                                       **_where(rec)})
    return {"groups": groups, "busy_threshold": BUSY}
