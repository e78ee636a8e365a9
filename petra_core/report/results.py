"""Gather a profile's run directories into tidy tables: the one results table the report reads.

``collect(profile)`` reads every run of the profile's grid (``petra_core.grid``) and returns

* ``results``  one row per run: run identity, final metrics, parameter count, resolved config, env;
* ``history``  one row per (run, epoch): the per-epoch record of ``history.json``;
* ``memory``   one row per (run, stage): ``peak_kept_bytes`` (bytes kept between forward and backward);
* ``fidelity`` one row per (run, step, stage) from ``fidelity.csv`` where a run has one (else empty).

``summarize(results)`` groups runs over seeds (mean, sample std, n). Everything else in the
report (tables, figures) reads these files only.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pandas as pd
import yaml

from .. import grid
from ..config import RunConfig

ID = ["profile", "dataset", "arch", "width", "method", "k", "seed"]
GROUP = ["profile", "dataset", "arch", "width", "method", "k"]
FINAL = ["top1", "top5", "test_loss", "train_loss", "train_acc", "best_top1", "top1_last10_mean",
         "optimizer_steps", "images_per_s", "wall_time_s"]
SUMMARY_METRICS = ["top1", "top1_last10_mean", "best_top1", "top5", "train_acc", "train_loss", "test_loss",
                   "images_per_s", "wall_time_s", "kept_total_mb", "kept_max_mb"]
ENV = ["git_revision", "torch", "device", "processor", "cpu_count", "torch_threads", "gpus"]
FIDELITY_FILE = "fidelity.csv"
FRAMES = ("results", "history", "memory", "fidelity")


class MissingRuns(FileNotFoundError):
    """Some runs of the grid have no ``metrics.json`` yet."""


def num_classes(cfg: dict) -> int:
    if cfg["dataset"] == "synthetic":
        return int(cfg["synthetic_classes"])
    return {"cifar10": 10, "imagenet32": 1000, "imagenet": 1000}[cfg["dataset"]]


@lru_cache(maxsize=None)
def model_facts(arch: str, classes: int, stem: str, width: int) -> tuple[int, str]:
    """(parameter count, stage kinds) of a model, built on the meta device (no memory, no time)."""
    import torch

    from ..models import build_model

    with torch.device("meta"):
        model = build_model(arch, num_classes=classes, stem=stem, width=width)
    return sum(p.numel() for p in model.parameters()), model.kinds


def read_run(run_dir: Path, profile: str, root: Path | None = None) -> dict[str, pd.DataFrame]:
    """The four tidy frames of one finished run directory."""
    from ..data.sources import STEMS

    run_dir = Path(run_dir)
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    RunConfig.from_dict(cfg)  # a record that no longer parses is an error, not a silent row
    metrics = json.loads((run_dir / "metrics.json").read_text())
    history = json.loads((run_dir / "history.json").read_text())
    env_path = run_dir / "env.json"
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    ident = {"profile": profile, **{key: cfg[key] for key in ID if key != "profile"},
             "run_dir": run_dir.as_posix() if root is None else run_dir.relative_to(root).as_posix()}
    params, kinds = model_facts(cfg["arch"], num_classes(cfg), STEMS[cfg["dataset"]], cfg["width"])
    kept = list(metrics.get("peak_kept_bytes") or [])
    row = {**ident, **{m: metrics.get(m) for m in FINAL}, "epochs_done": metrics.get("epochs"),
           "params": params, "num_stages": len(kinds.split()),
           "kept_total_mb": sum(kept) / 1e6 if kept else float("nan"),
           "kept_max_mb": max(kept) / 1e6 if kept else float("nan")}
    row.update({f"cfg_{key}": (json.dumps(value) if isinstance(value, list) else value) for key, value in cfg.items()
                if key not in ident})
    row.update({f"env_{key}": (json.dumps(env[key]) if isinstance(env.get(key), list) else env.get(key))
                for key in ENV if key in env})
    frames = {
        "results": pd.DataFrame([row]),
        "history": pd.DataFrame([{**ident, **h} for h in history]),
        "memory": pd.DataFrame([{**ident, "stage": j, "kind": kind, "kept_bytes": b}
                                for j, (kind, b) in enumerate(zip(kinds.split(), kept))]),
    }
    fid = run_dir / FIDELITY_FILE
    if fid.exists() and fid.stat().st_size:
        f = pd.read_csv(fid)
        frames["fidelity"] = pd.concat([pd.DataFrame([ident] * len(f)), f.drop(columns=["method"], errors="ignore")],
                                       axis=1)
    return frames


def collect(profile_path: str | Path, *, root: str | Path = ".", allow_missing: bool = False) -> dict[str, pd.DataFrame]:
    """Every finished run of the profile's grid as tidy frames (see the module docstring).

    ``root`` is the repository root the grid's ``runs/...`` paths are relative to.
    """
    spec = grid.load_profile(profile_path)
    dirs = [Path(root) / d for d in grid.run_dirs(spec)]
    missing = [d for d in dirs if not (d / "metrics.json").exists()]
    if missing and not allow_missing:
        raise MissingRuns(f"{len(missing)} of {len(dirs)} runs of profile {spec['profile']!r} have no metrics.json, "
                          f"e.g. {missing[0]}; train them first (snakemake) or pass allow_missing")
    parts = [read_run(d, spec["profile"], Path(root)) for d in dirs if d not in missing]
    frames = {}
    for name in FRAMES:
        found = [p[name] for p in parts if name in p]
        frames[name] = pd.concat(found, ignore_index=True) if found else pd.DataFrame(columns=ID + ["run_dir"])
    return frames


def summarize(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (profile, dataset, arch, width, method, k): n seeds, mean and sample std of each metric."""
    rows = []
    for key, g in results.groupby(GROUP, sort=True):
        row = dict(zip(GROUP, key))
        row.update(n=len(g), seeds=" ".join(str(s) for s in sorted(g.seed)), params=int(g.params.iloc[0]),
                   epochs=int(g.epochs_done.iloc[0]), batch_size=int(g.cfg_batch_size.iloc[0]))
        for m in SUMMARY_METRICS:
            values = pd.to_numeric(g[m], errors="coerce")
            row[f"{m}_mean"] = values.mean()
            row[f"{m}_std"] = values.std(ddof=1) if len(values) > 1 else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def metrics_json(summary: pd.DataFrame) -> dict:
    """Nested summary for ``dvc metrics show``: dataset -> arch-wW -> method-kK -> mean, std, n."""
    out: dict = {}
    for r in summary.itertuples():
        leaf = {"top1_mean": round(float(r.top1_mean), 4), "n": int(r.n)}
        if r.n > 1:
            leaf["top1_std"] = round(float(r.top1_std), 4)
        out.setdefault(r.dataset, {}).setdefault(f"{r.arch}-w{r.width}", {})[f"{r.method}-k{r.k}"] = leaf
    return out


def write(frames: dict[str, pd.DataFrame], out_dir: str | Path) -> list[Path]:
    """``results.csv``, ``history.csv``, ``memory.csv``, ``fidelity.csv``, ``summary.csv``, ``summary.json``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    summary = summarize(frames["results"])
    for name, frame in [*frames.items(), ("summary", summary)]:
        path = out_dir / f"{name}.csv"
        frame.to_csv(path, index=False, float_format="%.6g")
        paths.append(path)
    path = out_dir / "summary.json"
    path.write_text(json.dumps(metrics_json(summary), indent=2, sort_keys=True) + "\n")
    return [*paths, path]


def load(results_dir: str | Path) -> dict[str, pd.DataFrame]:
    """The tables written by :func:`write` (empty CSVs read as empty frames)."""
    results_dir = Path(results_dir)
    frames = {}
    for name in (*FRAMES, "summary"):
        path = results_dir / f"{name}.csv"
        try:
            frames[name] = pd.read_csv(path)
        except pd.errors.EmptyDataError:
            frames[name] = pd.DataFrame()
    return frames
