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
COLUMNS = {
    "pop_members_top1_mean": "members (mean)",
    "pop_ensemble_top1": "ensemble",
    "pop_average_top1": "average",
    "pop_average_top1_bn_reestimated": "average, BN re-estimated",
}


def is_population(summary: pd.DataFrame) -> bool:
    return (
        not summary.empty
        and "replica_rule" in summary.columns
        and summary.replica_rule.isin(list(RULES)).any()
        and "pop_ensemble_top1_mean" in summary.columns
    )


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
        row = {
            "dataset": r["dataset"],
            "arch": r["arch"],
            "width": r["width"],
            "rule": r["replica_rule"],
            "label": setting_label(r["replica_rule"], options),
            "p": options.get("p"),
            "n": int(r["n"]),
            "floats": r["floats_sent_per_step_mean"],
        }
        for c in COLUMNS:
            row[c], row[f"{c}_std"] = r[f"{c}_mean"], r[f"{c}_std"]
        rows.append(row)
    frame = pd.DataFrame(rows)
    papa = frame[frame.rule == "papa"].groupby("arch").floats.first()
    frame["floats_vs_papa"] = [
        f / papa[a] if a in papa and papa[a] else float("nan") for f, a in zip(frame.floats, frame.arch)
    ]
    order = {name: i for i, name in enumerate(RULES)}
    frame["order"] = [order[r] for r in frame.rule]
    return frame.sort_values(["dataset", "arch", "order", "p"], ignore_index=True).drop(columns="order")


CHANCE = {"cifar10": 10.0, "imagenet32": 0.1, "imagenet": 0.1}  # top-1 (%) of a constant guess
AVERAGE, ENSEMBLE = "pop_average_top1_bn_reestimated", "pop_ensemble_top1"


def _main(rows: pd.DataFrame):
    """A rule's main setting: the one with most seeds (the first, in p order, on a tie)."""
    return None if rows.empty else rows.loc[rows.n.idxmax()]


def _reaches(mean: float, std: float, target: float, target_std: float) -> bool:
    """Within noise: the mean is at least the target less the larger sd (0 where n = 1)."""
    spread = max(0.0 if pd.isna(std) else std, 0.0 if pd.isna(target_std) else target_std)
    return bool(mean >= target - spread)


def verdicts(frame: pd.DataFrame) -> list[dict]:
    """Per model: does WASH's averaged model (BN re-estimated) reach its own ensemble and the
    ensemble of independent models, how it compares with PAPA's, at what fraction of PAPA's floats,
    and what the naive average of independent models gives. Computed from the records, so the
    sentence the report prints is the data's, not an author's."""
    out = []
    for (dataset, arch), g in frame.groupby(["dataset", "arch"], sort=False):
        wash, papa = _main(g[g.rule == "wash"]), _main(g[g.rule == "papa"])
        independent = g[g.rule == "independent"]
        control = independent[independent.label == "Independent"]
        control = _main(control if not control.empty else independent)
        if wash is None:
            continue
        v = {
            "model": model_label(arch),
            "wash": wash.label,
            "chance": CHANCE.get(dataset),
            "n": int(wash.n),
            "average": wash[AVERAGE],
            "average_std": wash[f"{AVERAGE}_std"],
            "average_raw": wash["pop_average_top1"],
            "ensemble": wash[ENSEMBLE],
            "ensemble_std": wash[f"{ENSEMBLE}_std"],
            "members": wash["pop_members_top1_mean"],
        }
        v["gap_own"] = v["average"] - v["ensemble"]
        v["reaches_own"] = _reaches(v["average"], v["average_std"], v["ensemble"], v["ensemble_std"])
        if control is not None:
            v.update(
                independent=control.label,
                independent_n=int(control.n),
                independent_ensemble=control[ENSEMBLE],
                independent_members=control["pop_members_top1_mean"],
                naive_average=control["pop_average_top1"],
                naive_average_bn=control[AVERAGE],
            )
            v["gap_independent"] = v["average"] - v["independent_ensemble"]
            v["reaches_independent"] = _reaches(
                v["average"], v["average_std"], control[ENSEMBLE], control[f"{ENSEMBLE}_std"]
            )
        if papa is not None:
            v.update(
                papa=papa.label,
                papa_n=int(papa.n),
                papa_average=papa[AVERAGE],
                papa_average_std=papa[f"{AVERAGE}_std"],
                floats_vs_papa=wash.floats_vs_papa,
            )
        out.append(v)
    return out


def population_context(frames: dict, profile: str) -> dict:
    summary = frames["summary"]
    context = {
        "profile": profile,
        "gathered": not summary.empty,
        "applies": is_population(summary),
        "columns": COLUMNS,
        "models": [],
    }
    if not context["applies"]:
        return context
    frame = population_frame(summary)
    for (_dataset, arch), g in frame.groupby(["dataset", "arch"], sort=False):
        rows = []
        for r in g.to_dict("records"):
            cells = {c: {"mean": r[c], "std": r[f"{c}_std"], "n": r["n"]} for c in COLUMNS}
            rows.append({"label": r["label"], "cells": cells, "floats": r["floats"], "vs_papa": r["floats_vs_papa"]})
        context["models"].append({"model": model_label(arch), "rows": rows})
    context["verdicts"] = verdicts(frame)
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
        ax.set(
            xscale="log",
            xlabel="floats sent per replica per step",
            ylabel="top-1 (%)",
            title=f"{model_label(arch)} (triangles: the ensemble)",
        )
        ax.legend(fontsize="x-small", loc="best")
    fig.suptitle(f"Averaged model against communication (profile {profile}; mean ± sd over seeds)", y=1.02)
    fig.tight_layout()
    return fig
