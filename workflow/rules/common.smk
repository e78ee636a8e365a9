"""Shared by every rule: the selected profile, its grid (petra_core.workflow.grid, never a hand-written
path) and the targets of the pipeline."""

import json
import os
import shlex
import sys
from pathlib import Path

from petra_core.workflow import grid
from petra_core.run.config import WATCH_KEYS
from petra_core.reference import REFERENCE_FILE
from petra_core.report.results import RESULT_FILES
from petra_core.run import runio
from petra_core.run.runio import (ACCO_RESULTS, COST_FILES, CYCLIC_FILES, GPU_RESULTS, POPULATION_RESULTS,
                                  REPLICA_FILES, REPLICA_RESULTS)

# `petra` of the interpreter that runs Snakemake, also when its virtual environment is not active.
os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])

PROFILE = config["profile"]
PROFILE_FILE = f"{config['profiles_dir']}/{PROFILE}.yaml"
SPEC = grid.load_profile(PROFILE_FILE)
validate(SPEC, "../schemas/profile.schema.yaml")
if SPEC["profile"] != PROFILE:
    raise ValueError(f"{PROFILE_FILE} declares profile {SPEC['profile']!r}; expected {PROFILE!r} (its file name)")
# run directory -> grid run; grid.runs() validates every run's full config before any job starts
RUNS = {run.directory.as_posix(): run for run in grid.runs(SPEC)}
CONFIGS = {path: run.config for path, run in RUNS.items()}
DATA_SOURCES = {c.dataset: c.data_source for c in CONFIGS.values() if c.dataset != "synthetic"}
RESULTS = f"results/{PROFILE}"
REQUIRE_CLEAN_REVISION = str(config["require_clean_revision"]).lower() == "true"  # petra revision --check
COSTS = "results/costs"
CYCLIC = "results/cyclic"
# the replica-rule table and curves compare the cdp profile's runs whatever PROFILE is: its results
# are committed (and made by rule results when PROFILE is cdp); without them they say so
REPLICAS = [f"{REPLICA_RESULTS}/{name}" for name in REPLICA_FILES]
REPLICAS = REPLICAS if RESULTS == REPLICA_RESULTS or all(Path(f).exists() for f in REPLICAS) else []
# the population table and figure compare the wash profile's runs: its results once gathered
# (committed), or made by rule results when PROFILE is wash; until then they say so
POPULATIONS = [f"{POPULATION_RESULTS}/{name}" for name in REPLICA_FILES]
POPULATIONS = POPULATIONS if RESULTS == POPULATION_RESULTS or all(Path(f).exists() for f in POPULATIONS) else []
# the ACCO table and curves compare the acco profile's runs, the same way
ACCO = [f"{ACCO_RESULTS}/{name}" for name in REPLICA_FILES]
ACCO = ACCO if RESULTS == ACCO_RESULTS or all(Path(f).exists() for f in ACCO) else []
# GPU measurements (benchmarks/bench_gpu.py), committed when a GPU was lent: Table 1 renders them
GPU_FILES = sorted(str(path) for path in Path(GPU_RESULTS).glob("*.json"))
# Outputs of a run: small records committed to git (checkpoint.pt is DVC's). config.yaml and
# history.json, also committed, are written by petra train but are not outputs, because Snakemake
# deletes outputs before a rerun: petra compares config.yaml with the requested config before it
# resumes from checkpoint.pt (a changed run config is refused, loudly), and a run resumed from its
# final checkpoint does not write history.json again.
RECORDS = (runio.METRICS, runio.ENV)
REFERENCE = os.path.relpath(REFERENCE_FILE)
TEMPLATES = sorted(str(path) for path in Path("petra_core/report/templates").glob("*.j2"))
REPORT_CODE = sorted(str(path) for path in Path("petra_core/report").glob("*.py"))  # renders follow the code


wildcard_constraints:
    profile=PROFILE,
    dataset="|".join(sorted({c.dataset for c in CONFIGS.values()})),
    model=grid.WILDCARDS["model"],
    run=grid.WILDCARDS["run"],  # run_dir() checks that the path is a run of the profile


def run_dir(wildcards):
    path = grid.RUN_DIR_PATTERN.format(**wildcards)
    if path not in RUNS:
        raise ValueError(f"{path} is not a run of profile {PROFILE!r} ({PROFILE_FILE})")
    return path


def checkpoint_dir(wildcards):
    return RUNS[run_dir(wildcards)].checkpoint_dir.as_posix()


def train_inputs(wildcards):
    """ancient(): a clone or `dvc pull` gives these files new mtimes; they must not retrain a run."""
    cfg = CONFIGS[run_dir(wildcards)]
    inputs = {"profile": ancient(PROFILE_FILE)}
    if cfg.dataset != "synthetic":
        inputs["data"] = ancient(cfg.prepared_path().as_posix())
    return inputs


def train_overrides(wildcards):
    return " ".join(shlex.quote(item) for item in RUNS[run_dir(wildcards)].overrides())


def train_settings(wildcards):
    """The run's settings as the profile states them: a change reruns the run (params trigger)."""
    point = {**SPEC["train"], **RUNS[run_dir(wildcards)].point}
    return json.dumps({k: v for k, v in point.items() if k not in WATCH_KEYS}, sort_keys=True)


def train_command(wildcards):
    """`petra train`, or torchrun of it with one rank per GPU for `runtime: distributed` runs."""
    cfg = CONFIGS[run_dir(wildcards)]
    if cfg.runtime != "distributed":
        return "petra train"
    ranks = train_resource("gpu")
    if ranks < 2:
        raise ValueError(f"{run_dir(wildcards)}: runtime=distributed needs train_resources gpu >= 2 (one rank per GPU)")
    return f"torchrun --standalone --nproc-per-node={ranks} -m petra_core.cli train"


def train_threads(wildcards):
    return CONFIGS[run_dir(wildcards)].threads or config["train_threads"]


def train_resource(name):
    table = config["train_resources"]
    return table.get(PROFILE, table["default"])[name]


def run_records(name):
    return [f"{path}/{name}" for path in RUNS]


def all_targets():
    return [*(f"{RESULTS}/{name}" for name in RESULT_FILES), "paper_tables", "figures"]
