"""ACCO against its baselines (the ``acco`` profile): DDP (ZeRO-1), DPU with and without warm-up
steps, weight prediction and ACCO, early in training and at the end, per optimizer.

Read from the records only (``results.csv`` and ``history.csv`` of one profile's results
directory, ``results/acco`` by default whatever profile the rest of the report renders; its CSVs
are committed once the grid has run). *Early* is the first evaluated epoch at or past 10 % of
training. Every row is a (model, optimizer, rule, options) group, mean ± sd over its seeds, with
its gap to DDP (the ``zero1`` runs of the same model and optimizer; spreads added in quadrature).
"""

from __future__ import annotations

import math

import pandas as pd

from .labels import describe_runs, model_label
from .population import options_of

RULES = {"zero1": "DDP (ZeRO-1)", "dpu": "DPU", "wp": "WP", "acco": "ACCO"}
OPTIMIZERS = {"sgd": "SGD (Nesterov)", "adamw": "AdamW"}
CELLS = {
    "early_train_loss": "train loss, early",
    "early_top1": "top-1, early",
    "train_loss": "train loss, end",
    "top1": "top-1, end",
}
EARLY = 0.1  # of training


def setting_label(rule: str, options: dict) -> str:
    label = RULES.get(rule, rule)
    if rule == "dpu":
        w = int(options.get("warmup", 0))
        label += f", {w} warm-up steps" if w else ", no warm-up"
    return label


def applies(results: pd.DataFrame) -> bool:
    return not results.empty and "replica_rule" in results.columns and results.replica_rule.isin(["acco"]).any()


def run_frame(results: pd.DataFrame, history: pd.DataFrame) -> pd.DataFrame:
    """One row per run: its group (model, optimizer, rule label), the early epoch and the CELLS."""
    rows = []
    for r in results.to_dict("records"):
        h = history[history.run_dir == r["run_dir"]].sort_values("epoch")
        epochs = int(r.get("epochs_done") or h.epoch.max())
        evaluated = h.dropna(subset=["top1"])
        early = evaluated[evaluated.epoch >= EARLY * epochs]
        e = early.iloc[0] if not early.empty else None
        optimizer = r.get("optimizer", r.get("cfg_optimizer", "sgd"))
        rows.append(
            {
                "dataset": r["dataset"],
                "arch": r["arch"],
                "optimizer": optimizer,
                "rule": r["replica_rule"],
                "label": setting_label(r["replica_rule"], options_of(r)),
                "seed": r["seed"],
                "warmup": int(options_of(r).get("warmup", 0)),
                "early_epoch": None if e is None else int(e.epoch),
                "steps_per_epoch": r["optimizer_steps"] / epochs if epochs else float("nan"),
                "early_train_loss": float("nan") if e is None else e.train_loss,
                "early_top1": float("nan") if e is None else e.top1,
                "train_loss": r["train_loss"],
                "top1": r["top1"],
            }
        )
    return pd.DataFrame(rows)


def _spread(*stds) -> float:
    """The sds that are known, added in quadrature (NaN where none is: n = 1 on every side)."""
    known = [float(x) for x in stds if not pd.isna(x)]
    return math.sqrt(sum(x * x for x in known)) if known else float("nan")


def acco_frame(results: pd.DataFrame, history: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, optimizer, rule setting): each CELL's mean, sd and n, and its gap to DDP."""
    if not applies(results):
        return pd.DataFrame()
    runs = run_frame(results, history)
    keys = ["dataset", "arch", "optimizer", "rule", "warmup", "label"]
    rows = []
    for key, g in runs.groupby(keys, sort=False):
        row = dict(zip(keys, key), n=len(g), early_epoch=g.early_epoch.min(), steps_per_epoch=g.steps_per_epoch.iloc[0])
        for c in CELLS:
            row[c], row[f"{c}_std"] = g[c].mean(), g[c].std(ddof=1) if len(g) > 1 else float("nan")
        rows.append(row)
    frame = pd.DataFrame(rows)
    for c in CELLS:
        gaps, errs = [], []
        for r in frame.to_dict("records"):
            ddp = frame[(frame.rule == "zero1") & (frame.arch == r["arch"]) & (frame.optimizer == r["optimizer"])]
            if ddp.empty or r["rule"] == "zero1":
                gaps.append(float("nan"))
                errs.append(float("nan"))
                continue
            d = ddp.iloc[0]
            gaps.append(r[c] - d[c])
            errs.append(_spread(r[f"{c}_std"], d[f"{c}_std"]))
        frame[f"gap_{c}"], frame[f"gap_{c}_err"] = gaps, errs
    frame["order"] = [list(RULES).index(r) if r in RULES else 99 for r in frame.rule]
    frame["opt_order"] = [list(OPTIMIZERS).index(o) if o in OPTIMIZERS else 99 for o in frame.optimizer]
    return frame.sort_values(["dataset", "arch", "opt_order", "order", "warmup"], ignore_index=True).drop(
        columns=["order", "opt_order"]
    )


NOISE = 2.0  # a gap is within noise when |gap| <= NOISE x its sd (both groups' sds in quadrature)


def _judged(row: dict, cell: str) -> dict:
    """One cell's gap to DDP and whether it is within noise (None where no sd is known: n = 1)."""
    gap, err = row[f"gap_{cell}"], row[f"gap_{cell}_err"]
    within = None if pd.isna(err) else bool(abs(gap) <= NOISE * err)
    worse = gap > 0 if "loss" in cell else gap < 0
    behind = None if within is None else bool(not within and worse)
    return {"gap": gap, "err": err, "within": within, "worse": bool(worse), "behind": behind, "n": int(row["n"])}


def verdicts(frame: pd.DataFrame) -> list[dict]:
    """Per (model, optimizer): the paper's claim, that ACCO tracks DDP while DPU without warm-up lags
    early, asked of the records. It holds when ACCO ends level with DDP (neither its final train loss
    nor its top-1 worse than DDP's by more than noise), DPU without warm-up lags early (its early
    training loss above DDP's by more than noise) and ACCO's early training loss is below that DPU's
    by more than noise. Training loss is
    the paper's evidence (loss curves); a single early evaluation's top-1 is noisier, so it is
    reported, not judged. Computed, so the sentence printed is the data's, not an author's."""
    out = []
    for (arch, optimizer), g in frame.groupby(["arch", "optimizer"], sort=False):
        rows = g.to_dict("records")
        ddp = next((r for r in rows if r["rule"] == "zero1"), None)
        acco = next((r for r in rows if r["rule"] == "acco"), None)
        if ddp is None or acco is None:
            continue
        v = {
            "model": model_label(arch),
            "optimizer": OPTIMIZERS.get(optimizer, optimizer),
            "noise": NOISE,
            "acco": {c: _judged(acco, c) for c in CELLS},
            "dpu": [],
        }
        behind = [v["acco"][c]["behind"] for c in ("train_loss", "top1")]
        v["acco_level"] = None if None in behind else not any(behind)
        for r in rows:
            if r["rule"] != "dpu":
                continue
            early = {c: _judged(r, c) for c in ("early_train_loss", "early_top1")}
            loss = early["early_train_loss"]
            ahead, ahead_err = (
                r["early_train_loss"] - acco["early_train_loss"],
                _spread(r["early_train_loss_std"], acco["early_train_loss_std"]),
            )
            v["dpu"].append(
                {
                    "label": r["label"],
                    "warmup": int(r["warmup"]),
                    "early": early,
                    "final": {c: _judged(r, c) for c in ("train_loss", "top1")},
                    "lags_early": loss["behind"],
                    "acco_ahead": ahead,
                    "acco_ahead_err": ahead_err,
                    "acco_is_ahead": None if pd.isna(ahead_err) else bool(ahead > NOISE * ahead_err),
                }
            )
        base = next((d for d in v["dpu"] if d["warmup"] == 0), None)
        parts = None if base is None else [v["acco_level"], base["lags_early"], base["acco_is_ahead"]]
        v["claim_holds"] = None if parts is None or None in parts else all(parts)
        reasons = ("ACCO ends behind DDP", "DPU without warm-up does not lag early", "ACCO is not ahead of it early")
        v["failed"] = [why for why, ok in zip(reasons, parts or []) if ok is False]
        v["unjudged"] = (
            "there is no DPU without warm-up to compare"
            if parts is None
            else "it needs a second seed"
            if None in parts
            else None
        )
        out.append(v)
    return out


def acco_context(frames: dict, profile: str) -> dict:
    results = frames["results"]
    context = {
        "profile": profile,
        "gathered": not results.empty,
        "applies": applies(results),
        "cells": CELLS,
        "groups": [],
    }
    if not context["applies"]:
        return context
    frame = acco_frame(results, frames["history"])
    for (arch, optimizer), g in frame.groupby(["arch", "optimizer"], sort=False):
        rows = [
            {
                "label": r["label"],
                "cells": {
                    c: {
                        "mean": r[c],
                        "std": r[f"{c}_std"],
                        "n": r["n"],
                        "gap": None if r["rule"] == "zero1" else r[f"gap_{c}"],
                        "gap_err": r[f"gap_{c}_err"],
                    }
                    for c in CELLS
                },
            }
            for r in g.to_dict("records")
        ]
        context["groups"].append(
            {
                "model": model_label(arch),
                "optimizer": OPTIMIZERS.get(optimizer, optimizer),
                "early_epoch": int(g.early_epoch.min()),
                "rows": rows,
            }
        )
    context["verdicts"] = verdicts(frame)
    context["setting"] = describe_runs(results)
    return context


def acco_figure(frames: dict, profile: str):
    """Training loss and test top-1 against optimizer steps, a row of panels per optimizer, a line
    per rule setting (mean ± sd over seeds)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from .plotting import empty_figure

    results, history = frames["results"], frames["history"]
    if not applies(results):
        return empty_figure(f"results of profile {profile} hold no ACCO runs (the acco profile does)")
    runs = run_frame(results, history).set_index(pd.Index(results.run_dir))
    h = history[history.run_dir.isin(runs.index)].copy()
    for col in ("optimizer", "label", "steps_per_epoch"):
        h[col] = [runs.loc[d, col] for d in h.run_dir]
    h["steps"] = h.epoch * h.steps_per_epoch
    order = list(dict.fromkeys(acco_frame(results, history).label))
    optimizers = list(dict.fromkeys(h.optimizer))
    fig, axes = plt.subplots(len(optimizers), 2, figsize=(10, 3.4 * len(optimizers)), squeeze=False)
    for row, optimizer in zip(axes, optimizers):
        sub = h[h.optimizer == optimizer]
        for ax, (y, name) in zip(row, [("train_loss", "training loss"), ("top1", "test top-1 (%)")]):
            sns.lineplot(
                data=sub.dropna(subset=[y]),
                x="steps",
                y=y,
                hue="label",
                hue_order=order,
                errorbar="sd",
                marker="o",
                markersize=3,
                ax=ax,
                legend=ax is row[1],
            )
            ax.set(xlabel="optimizer steps", ylabel=name, title=f"{OPTIMIZERS.get(optimizer, optimizer)}: {name}")
        row[1].legend(fontsize="x-small", loc="best")
    arch = model_label(results.arch.iloc[0])
    fig.suptitle(f"ACCO and its baselines, {arch} (profile {profile}; mean ± sd over seeds)", y=1.01)
    fig.tight_layout()
    return fig
