"""How far a retrained record moved from the record it replaced: the spread between machines, measured.

When a committed record is retrained (at a clean revision, on another machine), git keeps the
record it replaced. This script reads both, the one at ``--before`` (a revision that still has the
old records) and the one in the working tree, and writes one row per retrained run: final top-1
and training loss before and after, their difference, and which of the fields that decide a run's
bits (``petra verify``'s list: revision, torch, CPU kernel set and model, threads, device) differ, or
were not recorded yet when the old record was written.
Runs whose record did not change are left out.

    python workflow/scripts/compare_retrained.py runs/budget --before 63ed40f --out results/budget/retrained.csv
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
from pathlib import Path

from petra_core.run import runio
from petra_core.run.verify import DECISIVE

COLUMNS = (
    "run",
    "before_revision",
    "after_revision",
    "top1_before",
    "top1_after",
    "top1_difference",
    "train_loss_before",
    "train_loss_after",
    "train_loss_difference",
    "differing",
    "unknown_before",
)


def at_revision(revision: str, path: Path) -> dict | None:
    """A JSON file as committed at ``revision`` (None where it did not exist then)."""
    shown = subprocess.run(["git", "show", f"{revision}:./{path.as_posix()}"], capture_output=True, text=True)
    return json.loads(shown.stdout) if shown.returncode == 0 else None


def compare(root: Path, before: str) -> list[dict]:
    rows = []
    for env_path in sorted(root.glob(f"**/{runio.ENV}")):
        run = env_path.parent
        old_env, old_metrics = at_revision(before, env_path), at_revision(before, run / runio.METRICS)
        if old_env is None or old_metrics is None:
            continue  # a new run, nothing to compare with
        env, metrics = json.loads(env_path.read_text()), json.loads((run / runio.METRICS).read_text())
        if old_env == env:
            continue  # not retrained
        differing = [key for key in DECISIVE if key in old_env and old_env[key] != env.get(key)]
        unknown = [key for key in DECISIVE if key not in old_env and key in env]  # the old record predates it
        rows.append(
            {
                "run": run.as_posix(),
                "before_revision": str(old_env.get("git_revision"))[:12],
                "after_revision": str(env.get("git_revision"))[:12],
                "top1_before": old_metrics["top1"],
                "top1_after": metrics["top1"],
                "top1_difference": round(metrics["top1"] - old_metrics["top1"], 4),
                "train_loss_before": old_metrics["train_loss"],
                "train_loss_after": metrics["train_loss"],
                "train_loss_difference": round(metrics["train_loss"] - old_metrics["train_loss"], 6),
                "differing": " ".join(differing),
                "unknown_before": " ".join(unknown),
            }
        )
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", type=Path, help="the run records to compare, e.g. runs/budget")
    p.add_argument("--before", required=True, help="a git revision that still holds the replaced records")
    p.add_argument("--out", type=Path, help="write the rows here as CSV")
    args = p.parse_args(argv)
    if (
        subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{args.before}^{{commit}}"], capture_output=True
        ).returncode
        != 0
    ):
        print(f"compare_retrained: --before {args.before!r} is not a commit of this repository", file=sys.stderr)
        return 2
    rows = compare(args.root, args.before)
    for r in rows:
        print(
            f"{r['run']}: top-1 {r['top1_before']:.2f} -> {r['top1_after']:.2f} ({r['top1_difference']:+.2f}), "
            f"train loss {r['train_loss_before']:.4f} -> {r['train_loss_after']:.4f}; "
            f"differing: {r['differing'] or '-'}"
            + (f"; not recorded before: {r['unknown_before']}" if r["unknown_before"] else "")
        )
    if rows:
        mean_abs = sum(abs(r["top1_difference"]) for r in rows) / len(rows)
        print(
            f"{len(rows)} retrained run(s): mean |top-1 difference| {mean_abs:.2f}, "
            f"largest {max(abs(r['top1_difference']) for r in rows):.2f} points"
        )
    else:
        print("no retrained run under", args.root)
    if args.out:
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        runio.write_text(args.out, text.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
