"""What every ``benchmarks/compare_official_<name>.py`` of the replica rules shares: refusing a
``--official PATH`` that is not the expected repository (one line, exit 2), reading its commit,
putting empty stand-in modules for imports the comparison never uses into ``sys.modules``, and
the record's common fields. Nothing of any official code is here; the scripts import it from the
user's copy."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
from pathlib import Path

import torch


class NotOfficial(SystemExit):
    """``--official`` does not hold the expected repository (one line, exit 2)."""


def check_official(path: Path, repo: str, needed: tuple[str, ...]) -> Path:
    """``path`` if it holds every file of ``needed``; else one line on stderr and exit 2."""
    path = Path(path).expanduser()
    missing = [name for name in needed if not (path / name).is_file()]
    if missing:
        print(
            f"error: --official {path} is not a copy of {repo}: it has no {missing[0]} (expected {', '.join(needed)})",
            file=sys.stderr,
        )
        raise NotOfficial(2)
    return path


def official_commit(path: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def stub_modules(stubs: dict[str, dict]) -> list[str]:
    """An empty module (with the given attributes) for each name that cannot be imported as is (a
    dotted name's missing parents are stubbed too); the names stubbed. Only names the official
    code imports but the comparison never runs should be listed, and every script's record says
    which were stubbed."""
    stubbed = []
    for name, attributes in stubs.items():
        try:
            importlib.import_module(name)
            continue  # installed: the official code gets the real one
        except ImportError:
            stubbed.append(name)
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
        module = sys.modules[name]
        for key, value in attributes.items():
            setattr(module, key, value)
        if len(parts) > 1:
            setattr(sys.modules[".".join(parts[:-1])], parts[-1], module)
    return stubbed


def diffs(ours: list[float], theirs: list[float], tolerance: float) -> dict:
    """The per-step comparison of two loss sequences: max |diff| and where they first part."""
    n = min(len(ours), len(theirs))
    d = [abs(float(a) - float(b)) for a, b in zip(ours[:n], theirs[:n])]
    return {
        "losses_compared": n,
        "losses_official": len(theirs),
        "losses_petra": len(ours),
        "max_abs_loss_diff": max(d) if d else None,
        "first_loss_beyond_tolerance": next((i for i, x in enumerate(d) if x > tolerance), None),
        "losses": {"petra": [float(x) for x in ours], "official": [float(x) for x in theirs]},
    }


def print_losses(ours: list[float], theirs: list[float], label) -> None:
    """One line per loss: ``label(i)``, petra's, the official code's, |diff| (the scripts' output)."""
    for i in range(max(len(ours), len(theirs))):
        a = f"{ours[i]:.17g}" if i < len(ours) else "-"
        b = f"{theirs[i]:.17g}" if i < len(theirs) else "-"
        d = f"{abs(ours[i] - theirs[i]):.2e}" if i < min(len(ours), len(theirs)) else "-"
        print(f"  {label(i):24s} petra {a:>22s}  official {b:>22s}  |diff| {d}")


def tensor_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())
