"""Shared by every rule: the selected profile, its grid (petra_core.workflow.grid, never a hand-written
path), the studies (workflow/studies/*.yaml, petra_core.workflow.studies: never a study's path
written here) and the targets of the pipeline."""

import json
import os
import shlex
import sys
from pathlib import Path

from petra_core.workflow import grid, studies
from petra_core.run.config import WATCH_KEYS
from petra_core.reference import REFERENCE_FILE
from petra_core.report.results import RESULT_FILES
from petra_core.run import runio
from petra_core.run.runio import COST_FILES, GPU_RESULTS, METRICS_DIR

# `petra` of the interpreter that runs Snakemake, also when its virtual environment is not active.
os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
# ... running this checkout's code, the code this Snakefile read (Snakemake puts the checkout first on
# sys.path), not the code that interpreter installed: a grid in a worktree beside main, with main's
# environment, trains the worktree's revision, which its records name (petra revision --check).
CHECKOUT = str(Path(grid.__file__).resolve().parents[2])
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [CHECKOUT, os.environ.get("PYTHONPATH", "")] if p)

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
STUDIES_DIR = config["studies_dir"]
STUDIES = studies.load_all(STUDIES_DIR)
MEASURED = [study for study in STUDIES if study.measured]  # a rule each, named after the study (aggregate.smk)


def study_records(study):
    """What a study's tables and figures read: a measured study's records (its rule makes them); a
    profile study's results when PROFILE is its profile (rule results makes them) or once gathered
    (committed), whatever PROFILE is; until then none, and its table says so."""
    paths = study.record_paths()
    if study.measured or study.results == RESULTS or all(Path(p).exists() for p in paths):
        return paths
    return []


STUDY_RECORDS = [path for study in STUDIES if study.renders for path in study_records(study)]
STUDY_FILES = sorted(
    {str(p) for p in Path(STUDIES_DIR).glob("*.yaml")}
    | {str(p) for study in STUDIES if study.templates for p in Path(study.templates).glob("*.j2")}
)
# GPU measurements (benchmarks/bench_gpu.py's <GPU>.json), committed when a GPU was lent: Table 1 renders them,
# and from each GPU's folder of evidence beside its file (<GPU>/) the records it reads too
GPU_FILES = sorted(str(path) for path in Path(GPU_RESULTS).glob("*.json"))
GPU_EVIDENCE = sorted(str(path) for path in Path(GPU_RESULTS).glob("*/*.json"))
# Outputs of a run: small records committed to git (checkpoint.pt is DVC's). config.yaml and
# history.json, also committed, are written by petra train but are not outputs, because Snakemake
# deletes outputs before a rerun: petra compares config.yaml with the requested config before it
# resumes from checkpoint.pt (a changed run config is refused, loudly), and a run resumed from its
# final checkpoint does not write history.json again.
RECORDS = (runio.METRICS, runio.ENV)
REFERENCE = os.path.relpath(REFERENCE_FILE)
TEMPLATES = sorted(str(path) for path in Path("petra_core/report/templates").glob("*.j2"))
# renders follow the code (the report, and the loader of the paper's figures it sets beside ours), and
# the registry that says which studies they render
REPORT_CODE = sorted(
    [
        *(str(path) for path in Path("petra_core/report").glob("*.py")),
        "petra_core/reference.py",
        "petra_core/workflow/studies.py",
    ]
)


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


def prepare_inputs(wildcards):
    """The dataset's raw source, where the profile names one (a fetching source has none)."""
    source = DATA_SOURCES[wildcards.dataset]
    return {"source": ancient(source)} if source else {}


def prepare_source_flag(wildcards):
    source = DATA_SOURCES[wildcards.dataset]
    return f"--source {shlex.quote(source)}" if source else ""


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
    return [*(f"{RESULTS}/{name}" for name in (*RESULT_FILES, METRICS_DIR)), "paper_tables", "figures"]
