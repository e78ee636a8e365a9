"""Fault injection for testing interruption and resume: ``petra train --fault-at RANK:TICK[:SIGNAL]``.

A run is only as safe as its stop-and-resume path, so that path is exercised on purpose: rank
RANK sends itself SIGNAL (default SIGTERM) right after tick TICK, as if someone had pressed Ctrl-C
at that moment (SIGKILL: as if the process died). TICK ``start``: as soon as the rank has joined
the run, before its pipeline exists. A resumed run starts after the tick it stopped at, so the same
list can interrupt it again later. The option is explicit on the command line (never read from
the environment) and the trainer records it in the run's ``env.json``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from .config import ConfigError

FORM = "RANK:TICK[:SIGNAL][,...]"


def parse_faults(spec: str) -> list[tuple[int, int, signal.Signals]]:
    """(rank, tick, signal) of every item of ``spec``; tick -1 stands for ``start``."""
    faults = []
    for item in spec.split(","):
        parts = item.strip().split(":")
        if len(parts) in (2, 3) and parts[1] == "start":
            parts[1] = "-1"
        if len(parts) not in (2, 3) or not all(p.strip().lstrip("-").isdigit() for p in parts[:2]):
            raise ConfigError(f"--fault-at {spec!r} is not of the form {FORM}")
        signum = getattr(signal, parts[2] if len(parts) == 3 else "SIGTERM", None)
        if not isinstance(signum, signal.Signals):
            raise ConfigError(
                f"--fault-at {spec!r}: unknown signal {parts[2]!r}; use a name such as SIGTERM or SIGKILL"
            )
        faults.append((int(parts[0]), int(parts[1]), signum))
    return faults


def fault_hook(spec: str | None, rank: int) -> Callable[[int], None] | None:
    """The trainer's per-tick hook that raises ``rank``'s faults of ``spec`` (None: no fault here)."""
    if not spec:
        return None
    at = {tick: signum for r, tick, signum in parse_faults(spec) if r == rank}

    def on_tick(tick: int) -> None:
        if tick in at:
            os.kill(os.getpid(), at[tick])

    return on_tick if at else None
