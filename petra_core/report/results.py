"""Gather a profile's run directories into tidy tables: the one results table the report reads.

``collect(profile)`` reads every run of the profile's grid (``petra_core.workflow.grid``) and returns

* ``results``  one row per run: run identity, final metrics, parameter count, resolved config, env;
* ``history``  one row per (run, epoch): the per-epoch record of ``history.json``;
* ``memory``   one row per (run, stage): ``peak_kept_bytes`` (bytes kept between forward and backward);
* ``fidelity`` one row per (run, step, stage) from ``fidelity.csv`` where a run has one (else empty).

A run's identity is the grid's (``grid.IDENTITY``, its ``run`` name, and the config keys the
profile varies besides, e.g. ``epochs``). ``summarize(results)`` groups runs over seeds (mean,
sample std, n). Everything here only reads the run records; the report's tables and figures
read these files only.

A language model's run (a family without top-1, e.g. a character-level GPT) has its own final
metrics (``TEXT_FINAL``: test loss in nats per character, bits per character, perplexity, token
accuracy); their columns appear only where such runs are, so an image profile's tables are as before.

DVC's metrics are one small JSON file per group of runs (``metrics/GROUP.json``: top-1 mean, its
std where n > 1, n; a language model's test loss and bits per character instead), because
``dvc metrics show`` prints one row per file and one column per key: a single nested file made one
row thousands of characters wide.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd

from ..run import runio
from ..run.config import RunConfig
from ..workflow import grid
from .labels import setting

FINAL = [
    "top1",
    "top5",
    "test_loss",
    "train_loss",
    "train_acc",
    "best_top1",
    "top1_last10_mean",
    "optimizer_steps",
    "images_per_s",
    "wall_time_s",
    "top1_bn_reestimated",
]
# a language model's (families without top-1: metrics.json has these, and no top1)
TEXT_FINAL = ["test_bpc", "test_ppl", "test_acc", "train_bpc", "train_ppl", "best_test_loss"]
# a population's evaluation (metrics.json "population", runs with replicas > 1), as pop_* columns
POPULATION = ["members_top1_mean", "ensemble_top1", "average_top1", "average_top1_bn_reestimated"]
SUMMARY_METRICS = [
    "top1",
    "top1_last10_mean",
    "best_top1",
    "top5",
    "train_acc",
    "train_loss",
    "test_loss",
    "images_per_s",
    "wall_time_s",
    "kept_total_mb",
    "kept_max_mb",
    "top1_bn_reestimated",
    "floats_sent_per_step",
    *(f"pop_{m}" for m in POPULATION),
]
ENV = ["git_revision", "torch", "device", "processor", "cpu_count", "torch_threads", "gpus"]
FRAMES = ("results", "history", "memory", "fidelity")
RESULT_FILES = (*(f"{name}.csv" for name in FRAMES), "summary.csv")
# studies' own tables beside the runs', read when present (not written by ``petra results``):
# ``delays``, benchmarks/delay_sensitivity.py's (the transformers study)
EXTRA_FRAMES = ("delays",)
METRICS_DIR = runio.METRICS_DIR  # DVC metrics: one GROUP.json per summary row


class MissingRuns(FileNotFoundError):
    """Some runs of the grid have no ``metrics.json`` yet."""


def read_run(run_dir: Path, ident: dict) -> dict[str, pd.DataFrame]:
    """The four tidy frames of one finished run directory; every row starts with ``ident``."""
    run_dir = Path(run_dir)
    cfg = runio.read_yaml(run_dir / runio.CONFIG)
    RunConfig.from_dict(cfg)  # a record that no longer parses is an error, not a silent row
    metrics = runio.read_json(run_dir / runio.METRICS)
    history = runio.read_json(run_dir / runio.HISTORY)
    env_path = run_dir / runio.ENV
    env = runio.read_json(env_path) if env_path.exists() else {}
    if "params" not in metrics or "stage_kinds" not in metrics:
        raise ValueError(
            f"{run_dir / runio.METRICS} records no parameter count or stage kinds (written by an "
            f"older petra); train the run again"
        )
    kinds = metrics["stage_kinds"].split()
    kept = list(metrics.get("peak_kept_bytes") or [])
    row = {
        **ident,
        **{m: metrics.get(m) for m in FINAL},
        **{m: metrics[m] for m in TEXT_FINAL if m in metrics},
        "epochs_done": metrics.get("epochs"),
        "params": metrics["params"],
        "num_stages": len(kinds),
        "kept_total_mb": sum(kept) / 1e6 if kept else float("nan"),
        "kept_max_mb": max(kept) / 1e6 if kept else float("nan"),
        "floats_sent_per_step": metrics.get("floats_sent_per_step", float("nan")),
    }
    population = metrics.get("population") or {}
    row.update({f"pop_{m}": population.get(m, float("nan")) for m in POPULATION})
    row["pop_members_top1"] = json.dumps(population["members_top1"]) if "members_top1" in population else None
    row.update(
        {
            f"cfg_{key}": (json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value)
            for key, value in cfg.items()
            if key not in ident
        }
    )
    row.update(
        {
            f"env_{key}": (json.dumps(env[key]) if isinstance(env.get(key), list) else env.get(key))
            for key in ENV
            if key in env
        }
    )
    frames = {
        "results": pd.DataFrame([row]),
        "history": pd.DataFrame([{**ident, **h} for h in history]),
        "memory": pd.DataFrame(
            [{**ident, "stage": j, "kind": kind, "kept_bytes": b} for j, (kind, b) in enumerate(zip(kinds, kept))]
        ),
    }
    fid = run_dir / runio.FIDELITY
    if fid.exists() and fid.stat().st_size:
        f = pd.read_csv(fid)
        frames["fidelity"] = pd.concat(
            [pd.DataFrame([ident] * len(f)), f.drop(columns=["method"], errors="ignore")], axis=1
        )
    return frames


def identity(run: grid.GridRun, extra: list[str], root: Path) -> dict:
    """The columns every row of a run starts with."""
    cfg = run.config.to_dict()
    return {
        "profile": run.profile,
        **{key: cfg[key] for key in grid.IDENTITY if key != "profile"},
        **{
            key: json.dumps(cfg[key], sort_keys=True) if isinstance(cfg[key], (list, dict)) else cfg[key]
            for key in extra
        },
        "run": run.name,
        "run_dir": run.directory.as_posix(),
    }


def collect(
    profile_path: str | Path, *, root: str | Path = ".", allow_missing: bool = False, log=None
) -> dict[str, pd.DataFrame]:
    """Every finished run of the profile's grid as tidy frames (see the module docstring).

    ``root`` is the repository root the grid's ``runs/...`` paths are relative to. With
    ``allow_missing``, ``log`` (if given) is told which unfinished runs were left out.
    """
    spec = grid.load_profile(profile_path)
    runs = grid.runs(spec)
    extra = grid.varying_keys(runs)
    root = Path(root)
    missing = [r.directory for r in runs if not (root / r.directory / runio.METRICS).exists()]
    if missing and not allow_missing:
        raise MissingRuns(
            f"{len(missing)} of {len(runs)} runs of profile {spec['profile']!r} have no metrics.json, "
            f"e.g. {missing[0].as_posix()}; train them first (snakemake) or leave them out with --allow-missing"
        )
    if missing and log is not None:
        log(
            f"left out {len(missing)} of {len(runs)} runs of profile {spec['profile']!r}, not finished: "
            + ", ".join(m.as_posix() for m in missing)
        )
    parts = [read_run(root / r.directory, identity(r, extra, root)) for r in runs if r.directory not in missing]
    columns = [*grid.IDENTITY, *extra, "run", "run_dir"]
    frames = {}
    for name in FRAMES:
        found = [p[name] for p in parts if name in p]
        frames[name] = pd.concat(found, ignore_index=True) if found else pd.DataFrame(columns=columns)
    return frames


def group_keys(frame: pd.DataFrame) -> list[str]:
    """What a summary row stands for: the identity without the seed, and any key the profile varies
    (the columns before ``run`` in results, before ``n`` in a summary)."""
    columns = list(frame.columns)
    end = columns.index("run") if "run" in columns else columns.index("n")
    return [c for c in columns[:end] if c != "seed"]


def summarize(results: pd.DataFrame) -> pd.DataFrame:
    """One row per group of runs that differ only in seed: n seeds, mean and sample std of each metric."""
    rows = []
    keys = group_keys(results)
    for key, g in results.groupby(keys, sort=True, dropna=False):  # a key only some runs set (aux_head) is NaN
        row = dict(zip(keys, key))
        row.update(
            n=len(g),
            seeds=" ".join(str(s) for s in sorted(g.seed)),
            params=int(g.params.iloc[0]),
            epochs=int(g.epochs_done.iloc[0]),
            batch_size=int(setting(g, "batch_size").iloc[0]),
        )
        for m in [*SUMMARY_METRICS, *(m for m in TEXT_FINAL if m in results.columns)]:
            values = pd.to_numeric(g[m], errors="coerce")
            row[f"{m}_mean"] = values.mean()
            row[f"{m}_std"] = values.std(ddof=1) if len(values) > 1 else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def _name_part(key: str, value) -> str:
    """``epochs=80``, ``rule_options=p0.01``; '' for a key this group does not set (NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "", str(value))
    return f"{key}={slug}" if slug else ""


def _width_part(width) -> str:
    """``-w64``; '' for a model whose width is its arch's own (unset)."""
    if width is None or (isinstance(width, float) and math.isnan(width)):
        return ""
    return f"-w{int(width)}"  # a column with NaN (a model at its own width) holds floats


def _wordy(column: pd.Series) -> bool:
    """A column of names (an optimizer, a rule), not of numbers or lists of them (epochs, milestones)."""
    return any(re.search("[A-Za-z]", str(v)) for v in column.dropna())


def group_names(summary: pd.DataFrame) -> list[str]:
    """A short file name per summary row: dataset, model and method, then only those of the keys
    the profile varies that are needed to tell the rows apart (greedily, the most telling first; on a
    tie a named choice such as the optimizer before a number such as the learning rate)."""
    records = summary.to_dict("records")
    names = [f"{r['dataset']}-{r['arch']}{_width_part(r['width'])}-{r['method']}-k{r['k']}" for r in records]
    candidates = [c for c in group_keys(summary) if c not in grid.IDENTITY]
    chosen: list[str] = []

    def named(keys):
        return ["-".join([base, *filter(None, (_name_part(k, r[k]) for k in keys))]) for base, r in zip(names, records)]

    while len(set(named(chosen))) < len(records) and len(chosen) < len(candidates):
        rest = [c for c in candidates if c not in chosen]
        best = max(
            rest,
            key=lambda c: (len(set(named([*chosen, c]))), _wordy(summary[c]), -rest.index(c)),
        )
        chosen.append(best)
    out = named([c for c in candidates if c in chosen])
    if len(set(out)) < len(out):
        raise ValueError(f"summary rows that no key tells apart: {sorted(n for n in out if out.count(n) > 1)}")
    return out


def metrics_files(summary: pd.DataFrame) -> dict[str, dict]:
    """``dvc metrics show``'s rows: group name -> top-1 mean, its std (only where n > 1) and n."""
    out = {}
    if summary.empty:
        return out
    for name, r in zip(group_names(summary), summary.to_dict("records")):
        text = math.isnan(float(r["top1_mean"])) and not math.isnan(float(r.get("test_bpc_mean", math.nan)))
        leaf = {"n": int(r["n"])}
        for m in ("test_loss", "test_bpc") if text else ("top1",):
            leaf[f"{m}_mean"] = round(float(r[f"{m}_mean"]), 4)
            if r["n"] > 1:
                leaf[f"{m}_std"] = round(float(r[f"{m}_std"]), 4)
        out[name] = leaf
    return out


def _mean_std(r: dict, metric: str, digits: int) -> str:
    """``80.12 ± 0.31`` (the std only where n > 1)."""
    std = r[f"{metric}_std"]
    return f"{r[f'{metric}_mean']:.{digits}f}" + ("" if r["n"] < 2 or math.isnan(std) else f" ± {std:.{digits}f}")


def summary_lines(summary: pd.DataFrame) -> list[str]:
    """One line per group of runs (``petra results`` prints them): top-1 and top-5 of image
    classifiers; test loss (nats per character), bits per character and perplexity of language models."""
    lines = []
    if summary.empty:
        return lines
    for name, r in zip(group_names(summary), summary.to_dict("records")):
        if math.isnan(float(r["top1_mean"])) and not math.isnan(float(r.get("test_bpc_mean", math.nan))):
            quality = (
                f"test loss {_mean_std(r, 'test_loss', 4)} nats/char, {_mean_std(r, 'test_bpc', 4)} bits/char, "
                f"perplexity {_mean_std(r, 'test_ppl', 3)}"
            )
        else:
            quality = f"top-1 {_mean_std(r, 'top1', 2)} %, top-5 {_mean_std(r, 'top5', 2)} %"
        lines.append(f"{name}: {quality} (n = {r['n']})")
    return lines


def write(frames: dict[str, pd.DataFrame], out_dir: str | Path) -> list[Path]:
    """``results.csv``, ``history.csv``, ``memory.csv``, ``fidelity.csv``, ``summary.csv`` and
    ``metrics/GROUP.json`` (DVC metrics, one file per summary row)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    summary = summarize(frames["results"])
    for name, frame in [*frames.items(), ("summary", summary)]:
        path = out_dir / f"{name}.csv"
        runio.write_text(path, frame.to_csv(index=False, float_format="%.6g"))
        paths.append(path)
    metrics = out_dir / METRICS_DIR
    metrics.mkdir(exist_ok=True)
    for stale in metrics.glob("*.json"):  # a group no longer in the profile
        stale.unlink()
    for name, leaf in metrics_files(summary).items():
        path = metrics / f"{name}.json"
        runio.write_text(path, json.dumps(runio.finite_json(leaf), indent=2, sort_keys=True, allow_nan=False) + "\n")
        paths.append(path)
    return paths


def load(results_dir: str | Path) -> dict[str, pd.DataFrame]:
    """The tables written by :func:`write` (empty CSVs read as empty frames), and the
    :data:`EXTRA_FRAMES` found there (absent: empty frames)."""
    results_dir = Path(results_dir)
    frames = {}
    for name in (*FRAMES, "summary"):
        path = results_dir / f"{name}.csv"
        if not path.exists():
            raise FileNotFoundError(
                f"{path} does not exist; gather the profile's runs first: petra results "
                f"--profile workflow/config/profiles/{results_dir.name}.yaml --out {results_dir}"
            )
        try:
            frames[name] = pd.read_csv(path)
        except pd.errors.EmptyDataError:
            frames[name] = pd.DataFrame()
    for name in EXTRA_FRAMES:
        path = results_dir / f"{name}.csv"
        frames[name] = pd.read_csv(path) if path.exists() else pd.DataFrame()
    return frames
