"""What is committed under ``results/`` is what the code measures today.

A measurement committed once (``results/costs``: Tables 1 and 3 and a fidelity sample;
``results/cyclic``: cyclic execution) is read by the report and quoted by the docs, and nothing
else runs it again: a change of the engine that moved a byte count once left Table 1 wrong. Here
each is measured again at its committed settings and compared with the committed files; their
DVC stages are checked to depend on every module the measurement runs; and every committed run
record's config is checked to be its grid point's, so each stays resumable and verifiable.

Compared exactly (as the written CSV/JSON text): every byte count, element count, FLOP count,
unit count, memory figure, schedule position and label; all of ``results/cyclic``; Table 3.
Excluded, because they are the wall clock of the machine that measured:

* ``table1_per_stage.csv``: the ``*_seconds`` columns;
* ``network_costs.csv``: the ``time_*`` columns;
* ``table1.csv``: ``measured`` and ``note`` of the ``time`` rows (the paper's column stays);
* ``costs.json``: ``machine`` and ``table1_seconds``.

The fidelity sample's cosines and norms come out of 80 training steps, whose float rounding
differs between CPUs and grows with the steps (a CI machine moved the delayed method's late
cosines and norms by up to 0.4 %): they are compared to a relative 1e-2 (its rows, stages and
steps exactly).
The training records' memory (``runs/**/metrics.json``, gathered into ``results/*/memory.csv``) was
measured by a past run at its own revision (its env.json names it), so it is not measured again here.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from petra_core.accounting import costs, cyclic
from petra_core.run import runio
from petra_core.run.config import check_same_run
from petra_core.run.runio import COST_FILES, CYCLIC_FILES
from petra_core.workflow import dvc_stages, grid, studies

ROOT = Path(__file__).resolve().parents[1]
COSTS, CYCLIC = ROOT / "results/costs", ROOT / "results/cyclic"
PROFILES = ROOT / "workflow/config/profiles"
PLANNED = ROOT / "workflow/config/planned"
TIMED_COLUMNS = {
    "table1_per_stage.csv": lambda column: column.endswith("_seconds"),
    "network_costs.csv": lambda column: column.startswith("time_"),
}
TIMED_JSON_KEYS = {"costs.json": ("machine", "table1_seconds")}
FIDELITY_VALUES = ("cosine", "rel_error", "grad_norm", "true_norm", "input_error")  # compared to FIDELITY_RTOL
FIDELITY_RTOL = 1e-2
FIDELITY_ATOL = {"input_error": 1e-6}  # a rebuild's rounding (about 1e-8) moves by more than 1 % across CPUs


def untimed(name: str, frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (a CSV read as text) without its wall-clock cells."""
    timed = TIMED_COLUMNS.get(name)
    if timed:
        frame = frame.drop(columns=[c for c in frame.columns if timed(c)])
    if name == "table1.csv":
        frame = frame.copy()
        frame.loc[frame.quantity == "time", ["measured", "note"]] = "(timed)"
    return frame


def frame_differences(name: str, committed: pd.DataFrame, measured: pd.DataFrame) -> list[str]:
    if list(committed.columns) != list(measured.columns):
        gone, new = set(committed.columns) - set(measured.columns), set(measured.columns) - set(committed.columns)
        return [f"{name}: columns committed, not measured {sorted(gone)}; measured, not committed {sorted(new)}"]
    if len(committed) != len(measured):
        return [f"{name}: {len(committed)} rows committed, {len(measured)} measured"]
    exact = [c for c in committed.columns if not (name == "fidelity.csv" and c in FIDELITY_VALUES)]
    found = []
    for column in committed.columns:
        a, b = committed[column], measured[column]
        if column in exact:
            same = a == b
        else:
            atol = FIDELITY_ATOL.get(column, 0)
            same = pd.Series(
                np.isclose(a.astype(float), b.astype(float), rtol=FIDELITY_RTOL, atol=atol, equal_nan=True)
            )
        for row in np.flatnonzero(~same.to_numpy())[:3]:
            found.append(f"{name} row {row} {column}: committed {a.iloc[row]}, measured {b.iloc[row]}")
    return found


def differences(committed_dir: Path, measured_dir: Path, names) -> list[str]:
    """Each committed cell that the measurement does not reproduce, as 'file row column: a, b'."""
    found = []
    for name in names:
        if name.endswith(".json"):
            a, b = (json.loads((d / name).read_text()) for d in (committed_dir, measured_dir))
            for key in sorted(set(a) | set(b)):
                if key not in TIMED_JSON_KEYS.get(name, ()) and a.get(key) != b.get(key):
                    found.append(f"{name} {key}: committed {a.get(key)}, measured {b.get(key)}")
            continue
        a, b = (pd.read_csv(d / name, dtype=str, keep_default_na=False) for d in (committed_dir, measured_dir))
        found += frame_differences(name, untimed(name, a), untimed(name, b))
    return found


@pytest.fixture(scope="module")
def measured_costs(tmp_path_factory):
    """``results/costs`` measured again, as the pipeline's ``costs`` rule does (its config's settings)."""
    config = yaml.safe_load((ROOT / "workflow/config/config.yaml").read_text())
    out = tmp_path_factory.mktemp("costs")
    costs.write(costs.measure(config["costs"] or None), out)
    return out


@pytest.mark.slow  # the fixture measures Table 1 at its committed settings: over 2 minutes on one core
def test_the_committed_costs_are_what_the_code_measures(measured_costs):
    """Table 1 (per stage, the table, per network), Table 3 and the fidelity sample. If this fails,
    measure again: ``dvc repro -f costs`` (or ``petra costs --out results/costs``), re-render."""
    assert differences(COSTS, measured_costs, COST_FILES) == []


def test_the_committed_cyclic_measurement_is_what_the_code_measures(tmp_path):
    """Every byte of results/cyclic (its study's command takes no settings). If this fails:
    ``dvc repro cyclic``."""
    cyclic.write(cyclic.measure(), tmp_path)
    assert differences(CYCLIC, tmp_path, CYCLIC_FILES) == []


@pytest.fixture
def tampered_costs(tmp_path):
    """The committed costs with one byte count moved by one byte (stage 1 of backprop: kept bytes)."""
    shutil.copytree(COSTS, tmp_path, dirs_exist_ok=True)
    path = tmp_path / "table1_per_stage.csv"
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    row = frame.index[(frame.method == "backprop") & (frame.stage == "1")][0]
    frame.loc[row, "kept_bytes"] = str(int(frame.loc[row, "kept_bytes"]) + 1)
    frame.to_csv(path, index=False)
    return tmp_path, row


def test_a_changed_byte_count_is_caught(tampered_costs):
    """Against the committed files themselves (so without the slow measurement): the one byte is found."""
    tampered, row = tampered_costs
    found = differences(tampered, COSTS, COST_FILES)
    assert len(found) == 1 and found[0].startswith(f"table1_per_stage.csv row {row} kept_bytes: committed ")


def test_a_changed_timing_is_not_a_difference(tmp_path):
    """The wall-clock cells differ run to run: changing them all changes nothing compared."""
    shutil.copytree(COSTS, tmp_path, dirs_exist_ok=True)
    path = tmp_path / "network_costs.csv"
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    frame[[c for c in frame.columns if c.startswith("time_")]] = "0"
    frame.to_csv(path, index=False)
    info = json.loads((tmp_path / "costs.json").read_text())
    (tmp_path / "costs.json").write_text(json.dumps({**info, "table1_seconds": -1.0}))
    assert differences(tmp_path, COSTS, COST_FILES) == []


# ---- the DVC stages measure again when the code that decides their numbers changes -------------------
SMALL = {  # settings small enough to load every module a measurement runs in a few seconds
    "costs": (
        "petra_core.accounting.costs",
        {"table1": {"image_size": 32, "width": 4, "num_batches": 2}, "fidelity": {"num_batches": 8, "width": 4}},
    ),
    "cyclic": ("petra_core.accounting.cyclic", {"archs": ["revnet18"], "width": 4, "batch": 2, "image_size": 16}),
    # the planner's answers at one cluster card (every method, both models: all the code the others run)
    "plan": (
        "petra_core.plan.answers",
        {"profile": str(ROOT / "results/gpu/nvidia-h200/stage_profile.json"), "clusters": ["8x1-100gbe"]},
    ),
}
NOT_DECIDING = {"__init__.py", "lazy.py", "run/__init__.py", "run/runio.py"}  # exports, and writing the files


def modules_run_by(stage: str) -> set[str]:
    """The petra_core files (relative to the package) that a small measurement of ``stage`` loads."""
    module, settings = SMALL[stage]
    script = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r}).measure(json.loads({json.dumps(settings)!r}))\n"
        "print(json.dumps(sorted(m.__file__ for m in list(sys.modules.values())\n"
        "    if getattr(m, '__name__', '').startswith('petra_core') and getattr(m, '__file__', None))))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    package = ROOT / "petra_core"
    return {str(Path(path).relative_to(package)) for path in json.loads(out.stdout.splitlines()[-1])}


@pytest.mark.parametrize("stage", sorted(SMALL))
def test_a_measured_stage_depends_on_every_module_its_measurement_runs(stage):
    """A change in any of them can move a committed number: DVC must see it (``dvc status``) and its
    command must measure again (Snakemake sees the committed files as never stale: --forcerun)."""
    pipeline = dvc_stages.pipeline(studies.load_all(ROOT / "workflow/studies"))
    spec = pipeline["stages"][stage]
    assert f"--forcerun {stage} " in spec["cmd"]
    deps = [dep.removeprefix("petra_core/") for dep in spec["deps"]]
    uncovered = {
        name
        for name in modules_run_by(stage) - NOT_DECIDING
        if not any(name == d or name.startswith(f"{d}/") for d in deps)
    }
    assert uncovered == set(), f"{stage}: add to its DVC deps"


# ---- the committed run records resume and verify against their profiles ------------------------------
PROFILES_WITH_RECORDS = sorted(p.name for p in (ROOT / "runs").iterdir() if p.is_dir())


@pytest.mark.parametrize("profile", PROFILES_WITH_RECORDS)
def test_every_committed_record_is_its_grid_points_run(profile):
    """``petra train`` resumes a record's run and ``petra verify`` checks it only if its config.yaml
    is its grid point's config (``check_same_run``): a key that a record lacks reads as today's
    default, which may not be what it ran (workflow/scripts/upgrade_records.py adds such keys). A
    grid being trained commits its runs' records as they finish: those are its planned profile's
    (workflow/config/planned/), which grows the committed one (tests/test_planned_profiles.py)."""
    points = {}
    for folder in (PLANNED, PROFILES):  # the committed profile's config wins where both name a run
        if (folder / f"{profile}.yaml").exists():
            points |= {run.directory: run.config for run in grid.runs(grid.load_profile(folder / f"{profile}.yaml"))}
    records = sorted(path.parent.relative_to(ROOT) for path in (ROOT / "runs" / profile).rglob(runio.CONFIG))
    assert records, f"runs/{profile} holds no record"
    for run_dir in records:
        assert run_dir in points, f"{run_dir} is no run of profile {profile}'s grid"
        check_same_run(run_dir, runio.read_yaml(ROOT / run_dir / runio.CONFIG), points[run_dir])
