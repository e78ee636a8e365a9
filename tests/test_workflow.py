"""The reproducible pipeline, end to end, on fresh clones of the committed repository.

(a) a clone renders every table and figure of the default profile from the committed runs, and
    Snakemake plans no training (restored run records must not look stale); DVC finds it up to
    date (`dvc status`, `dvc repro --dry`), and `dvc repro` trains nothing, also after the
    dataset has been prepared (where the raw data is at hand);
(b) the `smoke` profile runs end to end with Snakemake, and Table 2 holds its runs' metrics;
(c) `dvc repro` reproduces the same outputs, and a second `dvc repro` does nothing.

Slow (about 3 minutes on 2 cores). The clone is of the committed HEAD of this repository (or of
$PETRA_TEST_REPO); a test is skipped while what it needs is not committed yet.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from petra_core.workflow import grid

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def sh(args, cwd, check=True, timeout=600):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} failed ({proc.returncode}):\n{out[-4000:]}")
    return out


def clone(tmp_path) -> Path:
    source = os.environ.get("PETRA_TEST_REPO", str(ROOT))
    repo = tmp_path / "petra"
    sh(["git", "clone", "-q", source, str(repo)], cwd=tmp_path)
    missing = [
        p
        for p in ("Snakefile", "dvc.yaml", "params.yaml", "workflow/rules/common.smk", "results/costs/costs.json")
        if not (repo / p).exists()
    ]
    if missing:
        pytest.skip(f"not committed yet in {source}: {', '.join(missing)}")
    return repo


def planned_jobs(dry_run_output: str) -> dict[str, int]:
    """Rule -> count from the `Job stats` table of `snakemake -n` (empty if nothing to be done)."""
    jobs, table = {}, False
    for line in dry_run_output.splitlines():
        if line.startswith("Job stats:"):
            table = True
        elif table and (m := re.fullmatch(r"(\w+)\s+(\d+)", line.strip())):
            if m[1] != "total":
                jobs[m[1]] = int(m[2])
        elif table and not line.strip() and jobs:
            break
    return jobs


def snapshot(repo: Path) -> dict:
    """Every rendered file and result table, by path. The results table's env_* columns are left
    out: they name the code revision, which a commit between the two runs would change."""
    files = {}
    for d in ("paper_tables", "figures", "results/smoke"):
        for p in sorted((repo / d).rglob("*")):  # results/PROFILE/metrics/ holds a file per group
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(repo / d).parts):
                files[p.relative_to(repo).as_posix()] = p.read_bytes()
    results = pd.read_csv(repo / "results/smoke/results.csv")
    files["results/smoke/results.csv"] = results.drop(columns=results.filter(like="env_").columns).to_csv().encode()
    return files


def row(table: str, method: str, model: str) -> str:
    return next(line for line in table.splitlines() if line.startswith(f"| {method} | {model} |"))


def test_fresh_clone_renders_tables_and_figures_from_cached_runs(tmp_path):
    repo = clone(tmp_path)
    profile = yaml.safe_load((repo / "workflow/config/config.yaml").read_text())["profile"]
    spec = grid.load_profile(repo / f"workflow/config/profiles/{profile}.yaml")
    runs = grid.runs(spec)
    dirs = [repo / r.directory for r in runs]
    if not all((d / "metrics.json").exists() for d in dirs):
        pytest.skip(f"the runs of profile {profile!r} are not all committed")
    assert not (repo / "data/prepared").exists() and not (repo / "checkpoints").exists()

    # DVC: a fresh clone is up to date, and `dvc repro` has nothing to run
    assert sh([BIN / "dvc", "status", "--quiet"], cwd=repo, check=False) == "", sh([BIN / "dvc", "status"], cwd=repo)
    dry = sh([BIN / "dvc", "repro", "--dry"], cwd=repo)
    assert "Running stage" not in dry, dry[-2000:]

    dry = sh([BIN / "snakemake", "-n", "--cores", "2", "figures/", "paper_tables/"], cwd=repo)
    jobs = planned_jobs(dry)
    assert "train" not in jobs and "prepare" not in jobs and "costs" not in jobs, dry[-3000:]

    sh([BIN / "snakemake", "--cores", "2", "figures/", "paper_tables/"], cwd=repo)
    for name in ("fig4_accumulation", "training_curves", "memory_per_stage", "gradient_fidelity"):
        assert (repo / "figures" / f"{name}.png").stat().st_size > 0 and (repo / "figures" / f"{name}.pdf").exists()
    table2 = (repo / "paper_tables/table2_accuracy.md").read_text()
    assert f"profile `{profile}`" in table2
    longest = max(r.config.epochs for r in runs)
    bp = [
        json.loads((repo / r.directory / "metrics.json").read_text())["top1"]
        for r in runs
        if r.config.arch == "revnet18" and r.config.method == "backprop" and r.config.epochs == longest
    ]
    assert f"{sum(bp) / len(bp):.2f}" in row(table2, "Backprop", "RevNet18")
    assert not (repo / "logs" / profile / "train").exists(), "nothing was trained"

    # the prepared dataset does not make a finished run look stale, to Snakemake or to DVC
    source = repo / spec["train"].get("data_source", "")
    if spec["train"].get("dataset", "synthetic") != "synthetic" and source.is_file():
        sh([BIN / "petra", "prepare", spec["train"]["dataset"], "--source", str(source)], cwd=repo)
        assert "train" not in planned_jobs(sh([BIN / "snakemake", "-n", "--cores", "2"], cwd=repo))
        assert "Running stage" not in sh([BIN / "dvc", "repro"], cwd=repo)
        assert not (repo / "logs" / profile / "train").exists(), "nothing was trained"
        # a source newer than its prepared form (copied, re-extracted) prepares nothing again, and a
        # missing run is still planned in the same call (Snakemake 9 dropped it: snakemake#4166)
        os.utime(repo / "data" / "prepared" / spec["train"]["dataset"], (0, 0))
        missing = runs[0].directory / "metrics.json"
        (repo / missing).unlink()
        jobs = planned_jobs(sh([BIN / "snakemake", "-n", "--cores", "2", "--", str(missing)], cwd=repo))
        assert jobs.get("train") == 1 and "prepare" not in jobs, jobs


def test_smoke_profile_end_to_end_then_dvc_reproduces_it(tmp_path):
    repo = clone(tmp_path)
    # (b) Snakemake, the whole smoke grid
    sh([BIN / "snakemake", "--cores", "2", "--config", "profile=smoke"], cwd=repo)
    spec = grid.load_profile(repo / "workflow/config/profiles/smoke.yaml")
    runs = {r.directory: json.loads((repo / r.directory / "metrics.json").read_text()) for r in grid.runs(spec)}
    assert len(runs) == 7 and all((repo / r.checkpoint_dir / "checkpoint.pt").exists() for r in grid.runs(spec))
    table2 = (repo / "paper_tables/table2_accuracy.md").read_text()
    assert "profile `smoke`" in table2

    def top1(model, method, k=None):
        values = [
            m["top1"]
            for d, m in runs.items()
            if d.parent.name.startswith(model) and d.name.startswith(f"{method}-k{k or ''}")
        ]
        return sum(values) / len(values), len(values)

    for model, label, method, text in (
        ("resnet18", "ResNet18", "backprop", "Backprop"),
        ("revnet18", "RevNet18", "backprop", "Backprop"),
        ("revnet18", "RevNet18", "delayed", "Delayed (weight stash)"),
        ("revnet18", "RevNet18", "dsp", "DSP (input buffers)"),
    ):
        mean, n = top1(model, method)
        assert f"{mean:.2f}" in row(table2, text, label) and f"(n = {n})" in row(table2, text, label)
    petra = row(table2, "PETRA", "RevNet18")
    best = max((1, 2), key=lambda k: (runs[next(d for d in runs if d.name == f"petra-k{k}-seed0")]["train_acc"], -k))
    assert f"| {best} |" in petra and f"{top1('revnet18', 'petra', best)[0]:.2f}" in petra
    assert len((repo / "results/smoke/fidelity.csv").read_text().splitlines()) > 1, "fidelity.csv of the runs gathered"
    rendered = snapshot(repo)

    # (c) DVC: the same pipeline through `dvc repro` (every stage calls Snakemake) reproduces it
    sh([sys.executable, "workflow/scripts/dvc_params.py", "--profile", "smoke"], cwd=repo)
    first = sh([BIN / "dvc", "repro"], cwd=repo)
    assert "Running stage 'results'" in first and "Running stage 'render'" in first, first[-2000:]
    changed = [path for path, content in snapshot(repo).items() if rendered.get(path) != content]
    assert not changed and snapshot(repo).keys() == rendered.keys(), f"differ after dvc repro: {changed}"
    second = sh([BIN / "dvc", "repro"], cwd=repo)
    assert "Running stage" not in second and "up to date" in second, second[-2000:]
    assert "Nothing to be done" in sh([BIN / "snakemake", "-n", "--config", "profile=smoke"], cwd=repo)
