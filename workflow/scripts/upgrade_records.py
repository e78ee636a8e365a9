"""Bring run records written by an older petra up to what the report and resume read, without retraining.

Two upgrades, each recorded in the run's ``metrics.json`` as an entry of its ``upgraded`` list
(what was added, from what, by this script, at which revision); nothing the run measured is
touched, and a record that needs neither is left as it is:

* **model fields.** Since the report only reads records, ``metrics.json`` names the model it
  trained: parameter count, auxiliary-head parameters, number and kinds of stages. Runs trained
  before that lack these four fields. They are structural facts of the model the run's own
  ``config.yaml`` builds, not measurements, so this script builds that model (no training; the
  dataset, prepared, gives its classes) and adds them.
* **config keys added later** (:data:`CONFIG_KEYS_ADDED`). A record written before a key existed
  lacks it, and reads as today's default; where that default is not what every run did before the
  key existed (``channels_last``: true since eafe3ba, while every run before 59e6209 ran in
  contiguous NCHW), the record would claim a run it is not, and ``check_same_run`` would refuse to
  resume or verify it against its profile. The key is written into its ``config.yaml`` with the
  value the run had.

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
# key -> (the value of every run before the key existed, the revision that added it)
CONFIG_KEYS_ADDED = {"channels_last": (False, "59e6209")}
BY = "workflow/scripts/upgrade_records.py"


def model_fields(run_dir: Path, metrics: dict) -> dict | None:
    """The model fields ``metrics`` lacks, built from the run's config (an ``upgraded`` entry), or None."""
    if all(field in metrics for field in FIELDS):
        return None
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
    return {"fields": missing, "from": "config.yaml"}


def config_keys(config: dict) -> dict:
    """The keys of :data:`CONFIG_KEYS_ADDED` a record's ``config`` lacks, with the value the run had."""
    return {key: value for key, (value, _) in CONFIG_KEYS_ADDED.items() if key not in config}


def upgrade(run_dir: Path, revision: str) -> bool:
    """Both upgrades of ``run_dir`` (metrics.json, then config.yaml, each written atomically); False
    if nothing was missing."""
    path = run_dir / runio.METRICS
    metrics = json.loads(path.read_text())
    config = runio.read_yaml(run_dir / runio.CONFIG)
    entries = [model_fields(run_dir, metrics)]
    keys = config_keys(config)
    if keys:
        added_at = ", ".join(sorted({CONFIG_KEYS_ADDED[key][1] for key in keys}))
        entries.append({"config": keys, "from": f"the value of every run before the key existed ({added_at})"})
    entries = [entry for entry in entries if entry]
    if not entries:
        return False
    earlier = metrics.get("upgraded", [])
    earlier = [earlier] if isinstance(earlier, dict) else earlier  # a first upgrade was written as one entry
    metrics["upgraded"] = [*earlier, *({**entry, "by": BY, "revision": revision} for entry in entries)]
    runio.write_json(path, metrics)
    if keys:
        runio.write_yaml(run_dir / runio.CONFIG, {**config, **keys})
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
