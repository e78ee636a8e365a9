"""Benchmark records: what a benchmark measured, where, at which revision, on how busy a machine.

A benchmark run with ``--record`` writes ``results/benchmarks/<benchmark>-<variant>.json``
(:class:`Recorder`): its result, the command, the code revision, torch, the CPU model and cores, and
how busy the machine was. Benchmarks need an idle machine, so the recorder measures the CPU that
*other* processes used while it ran: all the machine's busy time (``/proc/stat``) less the
benchmark's own and its children's (``os.times``), in cores. The load average is kept too, but it
cannot judge: a benchmark's own threads, or the one run just before it, raise it. A record taken
while others used more than :data:`BUSY` cores says so. README.md's "Benchmarks" block is rendered
from these files by ``petra readme``
(:func:`benchmark_context`), never typed by hand.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import sys
import time
from pathlib import Path

BENCHMARK_RESULTS = "results/benchmarks"
BUSY = 0.25  # other processes' mean CPU use (cores) above this marks a record as taken on a busy machine


def _load_average() -> list[float] | None:
    return [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None


def _machine_busy_s() -> float | None:
    """Seconds of CPU the whole machine has spent busy since boot (every core; None off Linux)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # guest time is already in user


def _own_busy_s() -> float:
    """CPU seconds of this process and of its children that have been waited for (ranks, loaders)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class Recorder:
    """Opened before a benchmark measures (the load average then), written after."""

    def __init__(self, benchmark: str, variant: str, root: str | Path = BENCHMARK_RESULTS):
        self.benchmark, self.variant, self.root = benchmark, variant, Path(root)
        self.load_before = _load_average()
        self.started = datetime.datetime.now(datetime.timezone.utc)
        self._clock, self._machine, self._own = time.monotonic(), _machine_busy_s(), _own_busy_s()

    def other_cpu(self) -> float | None:
        """Mean cores used by other processes since the recorder opened."""
        machine, elapsed = _machine_busy_s(), time.monotonic() - self._clock
        if machine is None or self._machine is None or elapsed <= 0:
            return None
        return max(0.0, (machine - self._machine) - (_own_busy_s() - self._own)) / elapsed

    @property
    def path(self) -> Path:
        return self.root / f"{self.benchmark}-{self.variant}.json"

    def write(self, result: dict) -> Path:
        import torch

        from ..run import runio

        self.root.mkdir(parents=True, exist_ok=True)
        runio.write_json(
            self.path,
            {
                "benchmark": self.benchmark,
                "variant": self.variant,
                "command": shlex.join(["python", *[os.path.relpath(a) if a.endswith(".py") else a for a in sys.argv]]),
                "measured_at": self.started.isoformat(timespec="seconds"),
                "git_revision": runio.git_revision(outputs=(BENCHMARK_RESULTS,)),
                "torch": torch.__version__,
                "cpu_model": runio.cpu_model(),
                "cpu_count": os.cpu_count(),
                "other_cpu_cores": _round(self.other_cpu()),
                "load_average_before": self.load_before,
                "load_average_after": _load_average(),
                "result": result,
            },
        )
        return self.path


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def load(root: str | Path = BENCHMARK_RESULTS) -> dict[str, dict]:
    """Every record under ``root``, by file stem."""
    root = Path(root)
    if not root.is_dir():
        return {}
    return {p.stem: json.loads(p.read_text()) for p in sorted(root.glob("*.json"))}


def _where(rec: dict) -> dict:
    other = rec.get("other_cpu_cores")
    revision = rec.get("git_revision") or "unknown"
    return {
        "cpu": rec.get("cpu_model"),
        "cores": rec.get("cpu_count"),
        "torch": rec.get("torch"),
        "revision": revision[:12] + ("-dirty" if revision.endswith("-dirty") else ""),
        "other_cpu": other,
        "busy": other is not None and other > BUSY,
        "command": rec.get("command"),
        "date": rec.get("measured_at", "")[:10],
    }


def benchmark_context(records: dict[str, dict]) -> dict:
    """What ``readme_benchmarks.md.j2`` shows: one entry per record, grouped by benchmark."""
    groups: dict[str, list] = {}
    for rec in records.values():
        groups.setdefault(rec["benchmark"], []).append(
            {"variant": rec["variant"], "result": rec["result"], **_where(rec)}
        )
    return {"groups": groups, "busy_threshold": BUSY}
