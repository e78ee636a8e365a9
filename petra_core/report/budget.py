"""How the accuracy gap to backprop behaves as training gets longer (a profile of training budgets).

A profile whose grid varies ``epochs`` trains each method at several budgets (minibatches =
optimizer steps x k). :func:`gap_frame` pairs every (method, k, budget) with backprop at the
same budget: top-1 and its gap to backprop, as trained and with batch-norm statistics
re-estimated. :func:`trend` fits how the gap shrinks, a power law |gap| = c * minibatches^-a
(the gap is multiplied by 2^-a at every doubling), and extrapolates it to the paper's budget
(300 CIFAR-10 epochs, ~234,000 minibatches, where the paper's gap is 0).
The figure and the table of the report are drawn from these.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

METRICS = {"top1": "as trained", "top1_bn_reestimated": "batch-norm statistics re-estimated"}
DRAWS = 4000  # refits of a trend's parametric bootstrap (fit_uncertainty)


def varies_budget(summary: pd.DataFrame) -> bool:
    return "epochs" in summary.columns and summary.epochs.nunique() > 1


MODEL = ["dataset", "arch", "width"]  # what one gap-against-budget series is of


def at_largest_budget(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of each model's longest training, where a profile varies the budget (else all
    rows): a deeper model may stop at a smaller budget than RevNet18's."""
    if frame.empty or not varies_budget(frame):
        return frame
    keys = [k for k in MODEL if k in frame.columns]
    largest = frame.groupby(keys, dropna=False).epochs.transform("max") if keys else frame.epochs.max()
    return frame[frame.epochs == largest]


def paper_point(reference: dict) -> dict:
    """The paper's budget (minibatches) and gap on CIFAR-10, RevNet18, from the reference file."""
    b, recipe = reference["budget"], reference["recipe"][reference["budget"]["dataset"]]
    rows = {r["method"]: r for r in reference["table2"]["rows"] if r["arch"] == b["arch"] and r.get("variant") != "hub"}
    minibatches = recipe["epochs"] * b["train_examples"] // recipe["batch_petra"]
    gap = rows["petra"][b["dataset"]] - rows["backprop"][b["dataset"]]
    return {"minibatches": minibatches, "gap": gap, "epochs": recipe["epochs"], "batch": recipe["batch_petra"]}


def gap_frame(summary: pd.DataFrame, results: pd.DataFrame) -> pd.DataFrame:
    """One row per (dataset, arch, width, method, k, budget) of a method other than backprop."""
    minibatches = (results.optimizer_steps * results.k).groupby(results.epochs).max()  # the same for every model
    rows = []
    for r in summary.to_dict("records"):
        if r["method"] == "backprop":
            continue
        bp = summary[
            (summary.method == "backprop")
            & (summary.dataset == r["dataset"])
            & (summary.arch == r["arch"])
            & (summary.width == r["width"])
            & (summary.epochs == r["epochs"])
        ]
        if bp.empty:
            continue
        bp = bp.iloc[0].to_dict()
        row = {key: r[key] for key in ("dataset", "arch", "width", "method", "k", "epochs", "n")}
        row["num_stages"] = (
            int(results[results.arch == r["arch"]].num_stages.iloc[0]) if "num_stages" in results else None
        )
        row.update(minibatches=int(minibatches[r["epochs"]]), backprop_n=int(bp["n"]))
        for metric in METRICS:
            mean, std = r[f"{metric}_mean"], r[f"{metric}_std"]
            b_mean, b_std = bp[f"{metric}_mean"], bp[f"{metric}_std"]
            spread = [s for s in (std, b_std) if not pd.isna(s)]
            row.update(
                {
                    metric: mean,
                    f"{metric}_std": std,
                    f"backprop_{metric}": b_mean,
                    f"backprop_{metric}_std": b_std,
                    f"gap_{metric}": mean - b_mean,
                    f"gap_{metric}_err": math.sqrt(sum(s * s for s in spread)) if spread else float("nan"),
                }
            )
        rows.append(row)
    return (
        pd.DataFrame(rows).sort_values(["arch", "method", "k", "minibatches"], ignore_index=True)
        if rows
        else pd.DataFrame()
    )


def trend(
    frame: pd.DataFrame, method: str, k: int, at: float, metric: str = "top1", arch: str | None = None
) -> dict | None:
    """How the gap of (method, k) shrinks with the budget, and what that predicts at ``at`` minibatches.

    With every gap negative: least squares of log|gap| on log(minibatches), a power law whose
    ``factor_per_doubling`` (2^-a) multiplies the gap at each doubling. A gap that reached 0 or
    above at the largest budget has closed inside the measured range: ``kind="closed"``, no
    extrapolation (``predicted_gap`` NaN; ``closed_at``, the first budget from which it stays
    at or above 0). Otherwise (a gap above 0 only at smaller budgets): a straight line in
    log2(minibatches). ``monotonic``: the gap shrank at every step. The fit uses the mean gaps;
    ``uncertainty`` (:func:`fit_uncertainty`) says how far the seeds' spread moves it.
    """
    g = frame[(frame.method == method) & (frame.k == k)]
    if arch is not None:
        g = g[g.arch == arch]
    elif "arch" in g and g.arch.nunique() > 1:
        raise ValueError(
            f"the gaps of {method} k={k} are of several models ({', '.join(sorted(g.arch.unique()))}): name the arch"
        )
    g = g.sort_values("minibatches")
    if g.minibatches.nunique() < 2:
        return None
    x, gap = np.log2(g.minibatches.to_numpy(float)), g[f"gap_{metric}"].to_numpy(float)
    err = g[f"gap_{metric}_err"].to_numpy(float) if f"gap_{metric}_err" in g else np.full(gap.size, np.nan)
    out = {
        "method": method,
        "k": k,
        "arch": arch,
        "at": at,
        "monotonic": bool((np.diff(gap) > 0).all()),
        "budgets": int(gap.size),
    }
    if gap[-1] >= 0:
        below = np.flatnonzero(gap < 0)
        first = 0 if below.size == 0 else int(below[-1]) + 1
        return {
            **out,
            "kind": "closed",
            "closed_at": int(g.minibatches.iloc[first]),
            "predicted_gap": float("nan"),
            "uncertainty": None,
        }
    kind = "power" if (gap < 0).all() else "line"
    fit = _fit(kind, x, gap[:, None], at)
    out.update(kind=kind, predicted_gap=float(fit["predicted"][0]), uncertainty=fit_uncertainty(kind, x, gap, err, at))
    if kind == "power":
        out["factor_per_doubling"] = float(fit["slope_value"][0])
    else:
        out["points_per_doubling"] = float(fit["slope_value"][0])
    return out


def _fit(kind: str, x: np.ndarray, gaps: np.ndarray, at: float) -> dict:
    """The fit of each column of ``gaps`` (budgets × draws): its slope as reported (a factor per
    doubling, or points per doubling) and its prediction at ``at``."""
    if kind == "power":
        slope, intercept = np.polyfit(x, np.log2(-gaps), 1)
        return {"slope_value": 2.0**slope, "predicted": -(2.0 ** (intercept + slope * math.log2(at)))}
    slope, intercept = np.polyfit(x, gaps, 1)
    return {"slope_value": slope, "predicted": intercept + slope * math.log2(at)}


def fit_uncertainty(
    kind: str, x: np.ndarray, gap: np.ndarray, err: np.ndarray, at: float, draws: int = DRAWS, seed: int = 0
) -> dict | None:
    """How uncertain the trend is: a parametric bootstrap that redraws every budget's gap from a
    normal of its mean and its ± (the seeds' spread of both sides, combined), refits, and reports
    the 16th-84th percentiles of the slope and of the prediction (one standard deviation's
    worth). A budget with one seed on both sides has no spread of its own; it takes the median
    spread of the budgets that have one (``assumed`` counts them). None when no budget has one.
    Draws of a power law in which a gap reaches 0 cannot be fitted as one: ``closed_fraction``."""
    known = err[~np.isnan(err)]
    if known.size == 0:
        return None
    sd = np.where(np.isnan(err), float(np.median(known)), err)
    rng = np.random.default_rng(seed)
    sample = gap[:, None] + sd[:, None] * rng.standard_normal((gap.size, draws))
    fittable = (sample < 0).all(axis=0) if kind == "power" else np.ones(draws, bool)
    out = {"draws": draws, "assumed": int(np.isnan(err).sum()), "closed_fraction": float(1 - fittable.mean())}
    if fittable.sum() < draws // 2:  # mostly closed: no interval worth the name
        return {**out, "slope": None, "predicted": None}
    fit = _fit(kind, x, sample[:, fittable], at)
    return {
        **out,
        "slope": [float(v) for v in np.percentile(fit["slope_value"], [16, 84])],
        "predicted": [float(v) for v in np.percentile(fit["predicted"], [16, 84])],
    }


def trend_curve(fit: dict, xs) -> list[float]:
    """The fitted gap at the budgets ``xs`` (for drawing; nothing for a gap that closed)."""
    if fit["kind"] == "closed":
        return []
    if fit["kind"] == "power":
        ref = fit["predicted_gap"]
        return [ref * (x / fit["at"]) ** math.log2(fit["factor_per_doubling"]) for x in xs]
    return [fit["predicted_gap"] + fit["points_per_doubling"] * math.log2(x / fit["at"]) for x in xs]
