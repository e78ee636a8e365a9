"""Replica rules side by side (the ``cdp`` profile): each rule's top-1 against DP's at one budget.

Read from the records only (``summary``, ``history``, ``results``) of one profile's results
directory, ``results/cdp`` whatever profile the rest of the report renders (``workflow/studies/cdp.yaml``
declares it; :func:`load` reads any profile study's records): its CSVs are committed, so a clone
renders the table and the curves without training. A profile applies when it varies
``replica_rule``; every model gets one row per rule, mean ± sd over seeds, and the gap to DP (± the
spreads of both, added in quadrature).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..workflow.studies import PROFILE_RECORDS
from .budget import METRICS

RULE_ORDER = ["dp", "cdp1", "cdp2"]
RULE_LABELS = {"dp": "DP", "cdp1": "CDP1", "cdp2": "CDP2"}


def load(replicas_dir: str | Path, records: tuple[str, ...] = PROFILE_RECORDS) -> tuple[dict[str, pd.DataFrame], str]:
    """(frames, profile) of a results directory; empty frames where ``records`` are not all gathered yet."""
    from . import results as results_mod

    replicas_dir = Path(replicas_dir)
    if not all((replicas_dir / name).exists() for name in records):
        empty = pd.DataFrame()
        return {"summary": empty, "results": empty, "history": empty}, replicas_dir.name
    return results_mod.load(replicas_dir), replicas_dir.name


def varies_rule(frame: pd.DataFrame) -> bool:
    return "replica_rule" in frame.columns and frame.replica_rule.nunique() > 1


def rule_label(rule: str, stages=None) -> str:
    label = RULE_LABELS.get(rule, rule)
    return label + (f" (L = {int(stages)})" if stages is not None and not pd.isna(stages) else "")


def rule_frame(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, rule): each metric's mean, sd, n, and its gap to DP of the same model."""
    if not varies_rule(summary):
        return pd.DataFrame()
    rows = []
    for r in summary.to_dict("records"):
        dp = summary[
            (summary.replica_rule == "dp")
            & (summary.dataset == r["dataset"])
            & (summary.arch == r["arch"])
            & (summary.width == r["width"])
        ]
        row = {key: r[key] for key in ("dataset", "arch", "width", "replica_rule", "n")}
        row["rule_stages"] = r.get("rule_stages")
        for metric in METRICS:
            mean, std = r[f"{metric}_mean"], r[f"{metric}_std"]
            row.update({metric: mean, f"{metric}_std": std})
            if dp.empty:
                row.update({f"gap_{metric}": float("nan"), f"gap_{metric}_err": float("nan")})
                continue
            d = dp.iloc[0]
            spread = [s for s in (std, d[f"{metric}_std"]) if not pd.isna(s)]
            row.update(
                {
                    f"gap_{metric}": mean - d[f"{metric}_mean"],
                    f"gap_{metric}_err": math.sqrt(sum(s * s for s in spread)) if spread else float("nan"),
                }
            )
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame["order"] = [RULE_ORDER.index(x) if x in RULE_ORDER else 99 for x in frame.replica_rule]
    return frame.sort_values(["dataset", "arch", "order"], ignore_index=True).drop(columns="order")


def rule_context(frames: dict, profile: str) -> dict:
    """What ``replica_rules.{md,tex}`` shows."""
    from . import labels

    summary = frames["summary"]
    context = {
        "profile": profile,
        "applies": varies_rule(summary),
        "gathered": not summary.empty,
        "metrics": METRICS,
        "models": [],
    }
    if not context["applies"]:
        return context
    frame = rule_frame(summary)
    for (dataset, arch), g in frame.groupby(["dataset", "arch"], sort=False):
        rules = []
        for r in g.to_dict("records"):
            cells = {
                metric: {
                    "mean": r[metric],
                    "std": r[f"{metric}_std"],
                    "n": int(r["n"]),
                    "gap": None if r["replica_rule"] == "dp" else r[f"gap_{metric}"],
                    "gap_err": r[f"gap_{metric}_err"],
                }
                for metric in METRICS
            }
            rules.append({"label": rule_label(r["replica_rule"], r["rule_stages"]), "cells": cells})
        context["models"].append(
            {"model": labels.model_label(arch), "dataset": labels.DATASET_LABELS.get(dataset, dataset), "rules": rules}
        )
    from .labels import describe_runs

    context["setting"] = describe_runs(frames["results"])
    return context


def rule_curves(history: pd.DataFrame, profile: str):
    """Training loss and test top-1 against epoch, one row of panels per model, a line per rule."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from . import labels
    from .plotting import empty_figure

    if history.empty or not varies_rule(history):
        return empty_figure(f"profile {profile} varies no replica rule (the cdp profile does)")
    stages = history["rule_stages"] if "rule_stages" in history.columns else [None] * len(history)
    h = history.assign(rule=[rule_label(r, s) for r, s in zip(history.replica_rule, stages)])
    order = sorted(
        h.rule.unique(),
        key=lambda x: (
            [RULE_LABELS[k] for k in RULE_ORDER].index(x.split(" ")[0])
            if x.split(" ")[0] in RULE_LABELS.values()
            else 99
        ),
    )
    archs = list(h.arch.unique())
    fig, axes = plt.subplots(len(archs), 2, figsize=(10, 3.4 * len(archs)), squeeze=False)
    for row, arch in zip(axes, archs):
        sub = h[h.arch == arch]
        for ax, (y, name) in zip(row, [("train_loss", "training loss"), ("top1", "test top-1 (%)")]):
            data = sub.dropna(subset=[y])
            sns.lineplot(
                data=data,
                x="epoch",
                y=y,
                hue="rule",
                hue_order=order,
                errorbar="sd",
                marker="o",
                markersize=3,
                ax=ax,
                legend=ax is row[1],
            )
            ax.set(ylabel=name, title=f"{labels.model_label(arch)}: {name}")
        row[1].legend(fontsize="x-small", loc="best")
    fig.suptitle(f"Replica rules at one budget (profile {profile}; mean ± sd over seeds)", y=1.01)
    fig.tight_layout()
    return fig
