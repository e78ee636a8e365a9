"""Populations side by side (the ``wash`` profile): independent models, PAPA and WASH, each as its
members, their ensemble and their weight average, with the communication it cost.

Read from the records only (``summary.csv`` of one profile's results directory, ``results/wash``
by default whatever profile the rest of the report renders; its CSVs are committed once the
grid has run). Every row is a (model, rule, rule options) group, mean ± sd over its seeds.
"""
from __future__ import annotations

import json
import math

import pandas as pd

from .labels import describe_runs, model_label

RULES = {"independent": "Independent", "papa": "PAPA", "wash": "WASH"}
COLUMNS = {"pop_members_top1_mean": "members (mean)", "pop_ensemble_top1": "ensemble",
           "pop_average_top1": "average", "pop_average_top1_bn_reestimated": "average, BN re-estimated"}


def is_population(summary: pd.DataFrame) -> bool:
    return (not summary.empty and "replica_rule" in summary.columns
            and summary.replica_rule.isin(list(RULES)).any() and "pop_ensemble_top1_mean" in summary.columns)


def options_of(row) -> dict:
    raw = row.get("rule_options")
    if raw is None or (isinstance(raw, float) and math.isnan(raw)):
        return {}
    return json.loads(raw) if isinstance(raw, str) else dict(raw)


def setting_label(rule: str, options: dict) -> str:
    label = RULES.get(rule, rule)
    shown = {k: v for k, v in options.items() if k in ("p", "rate", "every", "init")}
    return label + (" (" + ", ".join(f"{k} = {v}" for k, v in shown.items()) + ")" if shown else "")


def population_frame(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, rule, options): the COLUMNS' means and sds, floats per step, and the
    floats as a fraction of PAPA's (same model, PAPA's first setting)."""
    if not is_population(summary):
        return pd.DataFrame()
    s = summary[summary.replica_rule.isin(list(RULES))]
    rows = []
    for r in s.to_dict("records"):
        options = options_of(r)
        row = {"dataset": r["dataset"], "arch": r["arch"], "width": r["width"], "rule": r["replica_rule"],
               "label": setting_label(r["replica_rule"], options), "p": options.get("p"), "n": int(r["n"]),
               "floats": r["floats_sent_per_step_mean"]}
        for c in COLUMNS:
            row[c], row[f"{c}_std"] = r[f"{c}_mean"], r[f"{c}_std"]
        rows.append(row)
    frame = pd.DataFrame(rows)
    papa = frame[frame.rule == "papa"].groupby("arch").floats.first()
    frame["floats_vs_papa"] = [f / papa[a] if a in papa and papa[a] else float("nan")
                               for f, a in zip(frame.floats, frame.arch)]
    order = {name: i for i, name in enumerate(RULES)}
    frame["order"] = [order[r] for r in frame.rule]
    return frame.sort_values(["dataset", "arch", "order", "p"], ignore_index=True).drop(columns="order")


def population_context(frames: dict, profile: str) -> dict:
    summary = frames["summary"]
    context = {"profile": profile, "gathered": not summary.empty, "applies": is_population(summary),
               "columns": COLUMNS, "models": []}
    if not context["applies"]:
        return context
    frame = population_frame(summary)
    for (dataset, arch), g in frame.groupby(["dataset", "arch"], sort=False):
        rows = []
        for r in g.to_dict("records"):
            cells = {c: {"mean": r[c], "std": r[f"{c}_std"], "n": r["n"]} for c in COLUMNS}
            rows.append({"label": r["label"], "cells": cells, "floats": r["floats"],
                         "vs_papa": r["floats_vs_papa"]})
        context["models"].append({"model": model_label(arch), "rows": rows})
    context["setting"] = describe_runs(frames["results"])
    return context


def population_figure(summary: pd.DataFrame, profile: str):
    """The averaged model's top-1 (batch-norm re-estimated) against floats sent per step, per model."""
    import matplotlib.pyplot as plt

    from .plotting import empty_figure

    frame = population_frame(summary)
    if frame.empty:
        return empty_figure(f"results of profile {profile} hold no population (the wash profile does)")
    archs = list(frame.arch.unique())
    fig, axes = plt.subplots(1, len(archs), figsize=(5.5 * len(archs), 4), squeeze=False)
    for ax, arch in zip(axes[0], archs):
        g = frame[frame.arch == arch]
        for r in g.to_dict("records"):
            x = max(r["floats"], 1.0)  # independent models send nothing: drawn at 1 on the log axis
            y, err = r["pop_average_top1_bn_reestimated"], r["pop_average_top1_bn_reestimated_std"]
            ax.errorbar([x], [y], yerr=[0 if pd.isna(err) else err], fmt="o", capsize=3, label=f"{r['label']}: average")
            ax.scatter([x], [r["pop_ensemble_top1"]], marker="^", facecolors="none", edgecolors="gray")
        ax.set(xscale="log", xlabel="floats sent per replica per step", ylabel="top-1 (%)",
               title=f"{model_label(arch)} (triangles: the ensemble)")
        ax.legend(fontsize="x-small", loc="best")
    fig.suptitle(f"Averaged model against communication (profile {profile}; mean ± sd over seeds)", y=1.02)
    fig.tight_layout()
    return fig
