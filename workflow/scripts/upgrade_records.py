"""Bring run records written by an older petra up to what the report reads, without retraining.

Since the report only reads records, ``metrics.json`` names the model it trained: parameter
count, auxiliary-head parameters, number and kinds of stages. Runs trained before that lack these
four fields. They are structural facts of the model the run's own ``config.yaml`` builds, not
measurements, so this script builds that model (no training; the dataset, prepared, gives its
classes) and adds them, with an ``upgraded`` entry saying which fields were added, by what and at
which revision. Nothing the run measured is touched; a record that already has the fields is left as it is.

    python workflow/scripts/upgrade_records.py runs/cpu           # every run under a directory
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from petra_core import build_model
from petra_core.data import build_data
from petra_core.run import runio
from petra_core.run.config import RunConfig
from petra_core.run.trainer import data_arguments

FIELDS = ("params", "aux_params", "stages", "stage_kinds")


def upgrade(run_dir: Path, revision: str) -> bool:
    """Add the model fields to ``run_dir``'s metrics.json (atomically); False if nothing was missing."""
    path = run_dir / runio.METRICS
    metrics = json.loads(path.read_text())
    if all(field in metrics for field in FIELDS):
        return False
    cfg = RunConfig.from_dict(yaml.safe_load((run_dir / runio.CONFIG).read_text()))
    data = build_data(
        **data_arguments(cfg)
    )  # the classes and stem the run trained with (prepared arrays, memory-mapped)
    model = build_model(cfg.arch, num_classes=data.num_classes, stem=data.stem, width=cfg.width, aux_head=cfg.aux_head)
    added = {
        "params": model.num_params(),
        "aux_params": model.num_params(aux=True),
        "stages": len(model),
        "stage_kinds": model.kinds,
    }
    missing = [field for field in FIELDS if field not in metrics]
    metrics.update({field: added[field] for field in missing})
    metrics["upgraded"] = {
        "fields": missing,
        "from": "config.yaml",
        "by": "workflow/scripts/upgrade_records.py",
        "revision": revision,
    }
    runio.write_json(path, metrics)
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("roots", nargs="+", type=Path, help="run directories, or directories holding them")
    args = p.parse_args(argv)
    revision = runio.environment("cpu")["git_revision"]
    runs = sorted({m.parent for root in args.roots for m in root.rglob(runio.METRICS)})
    if not runs:
        print(f"upgrade_records: no {runio.METRICS} under {', '.join(map(str, args.roots))}", file=sys.stderr)
        return 2
    for run_dir in runs:
        print(f"{run_dir}: {'upgraded' if upgrade(run_dir, revision) else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
