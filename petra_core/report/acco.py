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
TEXT_CELLS = {  # a language model's (nats per character): validation loss where an image model has top-1
    "early_train_loss": "train loss, early",
    "early_test_loss": "validation loss, early",
    "train_loss": "train loss, end",
    "test_loss": "validation loss, end",
}
EARLY = 0.1  # of training


def metric_of(results: pd.DataFrame) -> str:
    """The evaluated metric the rules are judged on: top-1, or a language model's validation loss
    (runs that record no top-1 but bits per character)."""
    text = "test_bpc" in results.columns and results.test_bpc.notna().any()
    return "test_loss" if text and not results.get("top1", pd.Series(dtype=float)).notna().any() else "top1"


def cells_of(results: pd.DataFrame) -> dict:
    return TEXT_CELLS if metric_of(results) == "test_loss" else CELLS


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
    metric = metric_of(results)
    rows = []
    for r in results.to_dict("records"):
        h = history[history.run_dir == r["run_dir"]].sort_values("epoch")
        epochs = int(r.get("epochs_done") or h.epoch.max())
        evaluated = h.dropna(subset=[metric])
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
                f"early_{metric}": float("nan") if e is None else e[metric],
                "train_loss": r["train_loss"],
                metric: r[metric],
                "images_per_s": r.get("images_per_s", float("nan")),
                "params": r.get("params", float("nan")),
                "replicas": r.get("cfg_replicas", float("nan")),
                "k": r.get("k", float("nan")),
                "batch_size": r.get("batch_size", r.get("cfg_batch_size", float("nan"))),
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
    cells = cells_of(results)
    keys = ["dataset", "arch", "optimizer", "rule", "warmup", "label"]
    rows = []
    for key, g in runs.groupby(keys, sort=False):
        row = dict(zip(keys, key), n=len(g), early_epoch=g.early_epoch.min(), steps_per_epoch=g.steps_per_epoch.iloc[0])
        for c in cells:
            row[c], row[f"{c}_std"] = g[c].mean(), g[c].std(ddof=1) if len(g) > 1 else float("nan")
        rows.append(row)
    frame = pd.DataFrame(rows)
    for c in cells:
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
    metric = "test_loss" if "test_loss" in frame.columns else "top1"
    cells = TEXT_CELLS if metric == "test_loss" else CELLS
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
            "metric": metric,
            "acco": {c: _judged(acco, c) for c in cells},
            "dpu": [],
        }
        behind = [v["acco"][c]["behind"] for c in ("train_loss", metric)]
        v["acco_level"] = None if None in behind else not any(behind)
        for r in rows:
            if r["rule"] != "dpu":
                continue
            early = {c: _judged(r, c) for c in ("early_train_loss", f"early_{metric}")}
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
                    "final": {c: _judged(r, c) for c in ("train_loss", metric)},
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


def clock_links(links: list | None) -> list[tuple]:
    """The links of a study's modelled wall-clock (its declaration's ``links``: each a ``name``, how
    the report calls it, a ``class`` of the cluster cards' link classes, and its ``latency_us``,
    ``bandwidth_gb_s``, ``efficiency``): (Link, name) pairs, none without a declaration."""
    from ..plan.cluster import PlanError, link_from_spec

    if links is None:
        return []
    if not isinstance(links, list) or not all(isinstance(x, dict) for x in links):
        raise PlanError(f"links is {links!r}; allowed: a list of mappings (name, class, latency_us, bandwidth_gb_s)")
    return [
        (
            link_from_spec(
                "study link", x.get("class", "ethernet"), {k: v for k, v in x.items() if k not in ("class", "name")}
            ),
            str(x.get("name", x.get("class", "ethernet"))),
        )
        for x in links
    ]


def clocked(runs: pd.DataFrame, links: list[tuple]) -> pd.DataFrame:
    """``runs`` (:func:`run_frame`) with the compute per replica and step every rule is clocked
    with and each run's modelled step on each link (``step_s:NAME``; :mod:`petra_core.plan.replica_clock`).

    Every rule computes the same k micro-batches per step, so the compute is one number per model,
    k and batch: the median over the runs of k micro-batches at each run's measured samples per
    second (the simulator's R replicas take R times a device's). The runs' own times differ by the
    machine's load only (``compute_min_s``, ``compute_max_s`` say by how much)."""
    from ..plan.replica_clock import step_seconds

    runs = runs.copy()
    runs["measured_s"] = runs.k * runs.batch_size / runs.images_per_s
    keys = ["arch", "k", "batch_size"]
    runs["compute_s"] = runs.groupby(keys).measured_s.transform("median")
    runs["compute_min_s"] = runs.groupby(keys).measured_s.transform("min")
    runs["compute_max_s"] = runs.groupby(keys).measured_s.transform("max")
    for link, name in links:
        runs[f"step_s:{name}"] = [
            step_seconds(r.rule, compute_s=r.compute_s, params=int(r.params), replicas=int(r.replicas), link=link)
            for r in runs.itertuples()
        ]
    return runs


def clock_context(results: pd.DataFrame, history: pd.DataFrame, links: list[tuple]) -> dict:
    """Per rule setting and link: the modelled step and the modelled time of the whole run (mean
    over seeds); the compute they are clocked with and the spread of the runs' own."""
    runs = clocked(run_frame(results, history), links)
    runs["steps"] = runs.steps_per_epoch * [int(e) for e in results.epochs_done]
    rows = []
    for label, g in runs.groupby("label", sort=False):
        rows.append(
            {
                "label": label,
                "links": [
                    {"step_s": g[f"step_s:{name}"].mean(), "total_h": (g.steps * g[f"step_s:{name}"]).mean() / 3600}
                    for _, name in links
                ],
            }
        )
    by_label = {r["label"]: r for r in rows}
    summary = []
    for i, (_, name) in enumerate(links):
        totals = {label: r["links"][i]["total_h"] for label, r in by_label.items()}
        ddp, acco = totals.get(RULES["zero1"]), totals.get(RULES["acco"])
        summary.append(
            {
                "link": name,
                "vs_ddp": [] if ddp is None else [(k, t / ddp) for k, t in totals.items() if k != RULES["zero1"]],
                "acco_vs_ddp": None if ddp is None or acco is None else acco / ddp,
            }
        )
    return {
        "links": [name for _, name in links],
        "summary": summary,
        "compute_s": float(runs.compute_s.median()),
        "compute_min_s": float(runs.compute_min_s.min()),
        "compute_max_s": float(runs.compute_max_s.max()),
        "rows": rows,
    }


def acco_context(frames: dict, profile: str, links: list | None = None) -> dict:
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
    context["cells"] = cells_of(results)
    context["metric"] = metric_of(results)
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
                    for c in context["cells"]
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
    parsed = clock_links(links)
    if parsed:
        context["clock"] = clock_context(results, frames["history"], parsed)
    return context


def acco_figure(frames: dict, profile: str, links: list | None = None):
    """Training loss and the evaluated metric (test top-1, or a language model's validation loss)
    against optimizer steps, a row of panels per optimizer, a line per rule setting (mean ± sd over
    seeds); with ``links``, also the evaluated metric against the modelled wall-clock on each."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from .plotting import empty_figure

    results, history = frames["results"], frames["history"]
    if not applies(results):
        return empty_figure(f"results of profile {profile} hold no ACCO runs (the acco profile does)")
    parsed = clock_links(links)
    runs = run_frame(results, history)
    if parsed:
        runs = clocked(runs, parsed)
    runs = runs.set_index(pd.Index(results.run_dir))
    h = history[history.run_dir.isin(runs.index)].copy()
    for col in ("optimizer", "label", "steps_per_epoch", *(f"step_s:{name}" for _, name in parsed)):
        h[col] = [runs.loc[d, col] for d in h.run_dir]
    h["steps"] = h.epoch * h.steps_per_epoch
    metric = metric_of(results)
    evaluated = ("top1", "test top-1 (%)") if metric == "top1" else ("test_loss", "validation loss (nats/char)")
    panels = [("steps", "train_loss", "training loss"), ("steps", *evaluated)]
    for _, name in parsed:
        h[f"hours:{name}"] = h.steps * h[f"step_s:{name}"] / 3600
        panels.append((f"hours:{name}", *evaluated))
    order = list(dict.fromkeys(acco_frame(results, history).label))
    optimizers = list(dict.fromkeys(h.optimizer))
    fig, axes = plt.subplots(
        len(optimizers), len(panels), figsize=(5 * len(panels), 3.4 * len(optimizers)), squeeze=False
    )
    for row, optimizer in zip(axes, optimizers):
        sub = h[h.optimizer == optimizer]
        for ax, (x, y, name) in zip(row, panels):
            sns.lineplot(
                data=sub.dropna(subset=[y]),
                x=x,
                y=y,
                hue="label",
                hue_order=order,
                errorbar="sd",
                marker="o",
                markersize=3,
                ax=ax,
                legend=ax is row[1],
            )
            xlabel = "optimizer steps" if x == "steps" else f"modelled wall-clock on {x.split(':', 1)[1]} (h)"
            ax.set(xlabel=xlabel, ylabel=name, title=f"{OPTIMIZERS.get(optimizer, optimizer)}: {name}")
        row[1].legend(fontsize="x-small", loc="best")
    arch = model_label(results.arch.iloc[0])
    fig.suptitle(f"ACCO and its baselines, {arch} (profile {profile}; mean ± sd over seeds)", y=1.01)
    fig.tight_layout()
    return fig
