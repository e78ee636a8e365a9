"""PETRA on reversible transformers (the ``transformers`` study): the gap to backprop at each
training budget, what reversibility costs (the reversible model's backprop against its
non-reversible twin's, the same parameter count) and the memory each method keeps per stage.

A language model is judged on validation loss (nats per character, lower is better), an image
model on top-1 (%). A gap is the method's metric minus backprop's on the same reversible model and
budget (mean over seeds, the sds added in quadrature), so a positive loss gap and a negative top-1
gap are both PETRA behind. The goals the study was set (issue 43) are asked of the records, not
typed: backprop's validation loss at 5,000 steps, and PETRA's gap at the largest budget.
"""

from __future__ import annotations

import math

import pandas as pd

from . import labels
from .labels import DATASET_LABELS, METHOD_LABELS, describe_runs, model_label

TWINS = {"revgpt": "gpt", "revvit": "vit"}  # a reversible model -> its non-reversible twin
GOALS = {  # (reversible arch, metric) -> the study's targets (issue 43's CPU-scale goals)
    ("revgpt", "test_loss"): {"backprop_at_most": 1.9, "backprop_within_steps": 5000, "gap_at_most": 0.05},
    ("revvit", "top1"): {"gap_shrinks": True},  # as on RevNets: smaller at the largest budget than the smallest
}
STUDY_LR = 1e-3  # the study's AdamW lr (profiles/transformers.yaml, train.base_lr): a setting names another
METRICS = {"test_loss": "validation loss (nats/char)", "top1": "top-1 (%)"}
DIGITS = {"test_loss": 3, "top1": 2}  # how a metric's values are printed
UNITS = {"test_loss": "nats/char", "top1": "points of top-1"}  # what a gap or cost in the metric is counted in


def applies(summary: pd.DataFrame) -> bool:
    return not summary.empty and summary.arch.isin(list(TWINS)).any()


def metric_of(rows: pd.DataFrame) -> str:
    """``test_loss`` for a language model's runs (they record bits per character), else ``top1``."""
    bpc = rows.get("test_bpc_mean", pd.Series(dtype=float))
    return "test_loss" if bpc.notna().any() else "top1"


def _number(frame: pd.DataFrame, key: str) -> pd.Series:
    """A numeric run setting per row (``labels.setting``: the identity's column or ``cfg_<key>``), 0
    where a run does not record it."""
    return pd.to_numeric(labels.setting(frame, key), errors="coerce").fillna(0)


def spans(frame: pd.DataFrame) -> pd.Series:
    """Each row's ``rebuild_span`` (0, the paper's PETRA, where a run does not record it)."""
    return _number(frame, "rebuild_span").astype(int)


def decays(frame: pd.DataFrame) -> pd.Series:
    """Each row's learning-rate decay after the warm-up (``step`` where a run does not record it)."""
    return labels.setting(frame, "lr_decay").fillna("step").astype(str)


def predictions(frame: pd.DataFrame) -> pd.Series:
    """Each row's ``weight_prediction`` (0, none, where a run does not record it)."""
    return _number(frame, "weight_prediction").astype(float)


def blocks(frame: pd.DataFrame) -> pd.Series:
    """Each row's ``blocks_per_stage`` (1, a stage per block, where a run does not record it)."""
    return _number(frame, "blocks_per_stage").replace(0, 1).astype(int)


def other_lrs(frame: pd.DataFrame) -> pd.Series:
    """Each row's ``base_lr`` where it is not the study's (:data:`STUDY_LR`), else 0."""
    lr = pd.to_numeric(labels.setting(frame, "base_lr"), errors="coerce").fillna(STUDY_LR).astype(float)
    return lr.where(~lr.apply(lambda x: math.isclose(x, STUDY_LR)), 0.0)


def settings_of(frame: pd.DataFrame) -> list[tuple]:
    """Each row's setting: (arch, method, k, rebuild span, lr decay, weight prediction, blocks per
    stage, lr where not the study's: 0 for it)."""
    return list(
        zip(
            frame.arch,
            frame.method,
            frame.k.astype(int),
            spans(frame),
            decays(frame),
            predictions(frame),
            blocks(frame),
            other_lrs(frame),
        )
    )


def trained(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of the study's training runs, without its diagnostic runs (``fidelity_every`` > 0:
    the same bits as the run without the tracker, kept for their fidelity logs)."""
    return frame[_number(frame, "fidelity_every") == 0]


def _spread(*stds) -> float:
    known = [float(s) for s in stds if not pd.isna(s)]
    return math.sqrt(sum(s * s for s in known)) if known else float("nan")


def _cell(row) -> dict:
    if row is None:
        return None
    return {"mean": row["mean"], "std": row["std"], "n": int(row["n"])}


def budget_frame(summary: pd.DataFrame, results: pd.DataFrame) -> pd.DataFrame:
    """One row per (dataset, reversible arch, budget, method, k, rebuild span, lr decay, weight
    prediction, blocks per stage, lr) of the reversible model or its twin's backprop: the metric's
    mean, sd, n and, but for backprop (a stage per block), the gap to backprop under the same
    learning-rate decay and lr."""
    rows = []
    summary, results = trained(summary), trained(results)
    for rev, twin in TWINS.items():
        mine = summary[summary.arch.isin([rev, twin])]
        if mine.empty or rev not in set(mine.arch):
            continue
        metric = metric_of(mine[mine.arch == rev])
        for dataset, d in mine.groupby("dataset", sort=False):
            for epochs, g in d.groupby("epochs"):
                done = results[(results.arch == rev) & (results.dataset == dataset) & (results.epochs == epochs)]
                minibatches = int((done.optimizer_steps * done.k).max()) if not done.empty else None
                stats = {
                    setting: {"mean": r[f"{metric}_mean"], "std": r[f"{metric}_std"], "n": r["n"]}
                    for r, setting in zip(g.to_dict("records"), settings_of(g))
                }
                for (arch, method, k, span, decay, predict, per_stage, lr), s in stats.items():
                    if arch == twin and method != "backprop":
                        continue
                    bp = stats.get((rev, "backprop", 1, 0, decay, 0.0, 1, lr))  # under the same decay and lr
                    gap = err = float("nan")
                    if bp is not None and (arch, method, per_stage) != (rev, "backprop", 1):
                        gap, err = s["mean"] - bp["mean"], _spread(s["std"], bp["std"])
                    rows.append(
                        {
                            "dataset": dataset,
                            "model": rev,
                            "arch": arch,
                            "method": method,
                            "k": k,
                            "span": span,
                            "decay": decay,
                            "predict": predict,
                            "blocks": per_stage,
                            "lr": lr,
                            "epochs": epochs,
                            "minibatches": minibatches,
                            "metric": metric,
                            **s,
                            "gap": gap,
                            "gap_err": err,
                        }
                    )
    return pd.DataFrame(rows)


def _setting(
    arch: str,
    method: str,
    k: int = 1,
    span: int = 0,
    decay: str = "step",
    predict: float = 0.0,
    per_stage: int = 1,
    lr: float = 0.0,
) -> str:
    label = f"{model_label(arch)}, {METHOD_LABELS.get(method, method)}"
    return label + _options(k, span, decay, predict, per_stage, lr)


def _options(
    k: int = 1, span: int = 0, decay: str = "step", predict: float = 0.0, per_stage: int = 1, lr: float = 0.0
) -> str:
    """`` (k = 4, rebuild span 1, cosine decay, weight prediction 1, 2 blocks a stage, lr 0.0001)``:
    what departs from the study's plain setting (``lr`` 0: the study's); '' for none."""
    departs = {
        f"k = {k}": k != 1,
        f"rebuild span {span}": span != 0,
        f"{decay} decay": decay != "step",
        f"weight prediction {predict:g}": predict != 0,
        f"{per_stage} blocks a stage": per_stage != 1,
        f"lr {lr:g}": lr != 0,
    }
    options = [text for text, departing in departs.items() if departing]
    return f" ({', '.join(options)})" if options else ""


def _key(r) -> tuple:
    """A budget-frame row's setting, as :func:`settings_of` gives it."""
    return (
        r["arch"],
        r["method"],
        int(r["k"]),
        int(r["span"]),
        r["decay"],
        float(r["predict"]),
        int(r["blocks"]),
        float(r["lr"]),
    )


def _variants(s: pd.DataFrame, rev: str) -> list[tuple]:
    """The settings of a model's rows: the study's lr and step decay first, then each other lr and
    decay, and in each its backprop, its methods, the twin last."""
    keys = {_key(r) for r in s.to_dict("records")}
    return sorted(
        keys,
        key=lambda a: (a[7], a[4] != "step", a[4], a[0] != rev, a[1] != "backprop", a[1], a[2], a[3], a[5], a[6]),
    )


def goals(frame: pd.DataFrame) -> list[dict]:
    """The study's goals asked of the records: each with its value, target and whether it is met."""
    out = []
    for (rev, metric), target in GOALS.items():
        mine = frame[(frame.model == rev) & (frame.metric == metric)]
        if mine.empty:
            continue
        bp = mine[(mine.arch == rev) & (mine.method == "backprop")]
        within = bp[bp.minibatches <= target.get("backprop_within_steps", -1)]
        if "backprop_at_most" in target and not within.empty:
            best = within.loc[within["mean"].idxmin()]
            out.append(
                {
                    "what": f"{model_label(rev)} backprop"
                    f"{_options(1, 0, best['decay'], best['predict'], 1, best['lr'])}, "
                    f"{METRICS[metric]} within "
                    f"{target['backprop_within_steps']:,} steps",
                    "value": best["mean"],
                    "err": best["std"],
                    "target": f"≤ {target['backprop_at_most']}",
                    "met": bool(best["mean"] <= target["backprop_at_most"]),
                }
            )
        every = mine[(mine.arch == rev) & (mine.method == "petra") & (mine.k == 1)].dropna(subset=["gap"])
        order = sorted(
            set(zip(every.decay, every.span, every.predict, every.blocks, every.lr)),
            key=lambda o: (o[4], o[0] != "step", o),
        )
        for decay, span, predict, per_stage, lr in order:  # the paper's PETRA, bounded rebuild chains, other recipes
            petra = every[
                (every.decay == decay)
                & (every.span == span)
                & (every.predict == predict)
                & (every.blocks == per_stage)
                & (every.lr == lr)
            ]
            who = f"{model_label(rev)} PETRA" + _options(1, span, decay, predict, per_stage, lr)
            if target.get("gap_shrinks") and petra.minibatches.nunique() >= 2:
                first, last = petra.loc[petra.minibatches.idxmin()], petra.loc[petra.minibatches.idxmax()]
                out.append(
                    {
                        "what": f"{who}'s gap to backprop ({METRICS[metric]}) at {int(last.minibatches):,} minibatches",
                        "value": last["gap"],
                        "err": last["gap_err"],
                        "target": f"smaller in size than its {first['gap']:+.3f} at {int(first.minibatches):,}",
                        "met": bool(abs(last["gap"]) < abs(first["gap"])),
                    }
                )
            if "gap_at_most" in target:
                last = petra.loc[petra.minibatches.idxmax()]
                out.append(
                    {
                        "what": f"{who}'s gap to backprop at {int(last.minibatches):,} minibatches",
                        "value": last["gap"],
                        "err": last["gap_err"],
                        "target": f"≤ {target['gap_at_most']}",
                        "met": bool(last["gap"] <= target["gap_at_most"]),
                    }
                )
    return out


def where_the_gap_is(frame: pd.DataFrame) -> list[dict]:
    """Per reversible model and recipe (decay, weight prediction, lr; the study's first), at the
    largest budget where PETRA (k = 1) and delayed gradients with weight stashing both ran under it:
    PETRA's gap to backprop split into the delay's share (the stashed run has PETRA's delays with
    exact weights) and the rest (PETRA computes on current weights, its input rebuilt with them).
    Where DSP ran there too, the rest splits again: current weights on exact inputs (DSP minus
    delayed) and the rebuilt inputs (PETRA minus DSP). Beside them, PETRA under the same recipe with
    k > 1, with bounded rebuild chains and with several blocks a stage (fewer stages, shorter
    delays). Only what the records hold."""
    out = []
    for rev, s in frame[frame.arch.isin(list(TWINS))].groupby("model", sort=False):
        model = s[s.arch == rev]
        by_recipe = model.groupby(["decay", "predict", "lr"], sort=False)
        study_first = sorted(by_recipe, key=lambda group: group[0] != ("step", 0, 0))  # stable: the rest as met
        for (decay, predict, lr), mine in study_first:
            split = mine[(mine.method == "petra") & (mine.k == 1) & (mine.span == 0) & (mine.blocks > 1)]
            mine = mine[mine.blocks == 1]
            plain = (mine.k == 1) & (mine.span == 0)
            petra = mine[plain & (mine.method == "petra")].set_index("minibatches")
            delayed = mine[plain & (mine.method == "delayed")].set_index("minibatches")
            both = sorted(set(petra.index) & set(delayed.index))
            if not both:
                continue
            at = both[-1]
            dsp = mine[plain & (mine.method == "dsp") & (mine.minibatches == at)]
            others = mine[(mine.method == "petra") & (mine.minibatches == at) & ~plain].sort_values(["span", "k"])
            current = float(dsp.gap.iloc[0]) - delayed.loc[at, "gap"] if not dsp.empty else None
            fewer = split[split.minibatches == at].sort_values("blocks")
            out.append(
                {
                    "model": model_label(rev),
                    "recipe": _options(decay=decay, predict=predict, lr=lr).strip(" ()"),  # '' for the study's
                    "unit": UNITS[petra.loc[at, "metric"]],
                    "minibatches": int(at),
                    "petra": petra.loc[at, "gap"],
                    "delay": delayed.loc[at, "gap"],
                    "rest": petra.loc[at, "gap"] - delayed.loc[at, "gap"],
                    "current_weights": current,
                    "rebuilt_inputs": petra.loc[at, "gap"] - float(dsp.gap.iloc[0]) if not dsp.empty else None,
                    "larger_k": [{"k": int(r.k), "gap": r.gap} for r in others.itertuples() if r.span == 0],
                    "bounded": [{"span": int(r.span), "gap": r.gap} for r in others.itertuples() if r.k == 1],
                    "fewer_stages": [{"blocks": int(r.blocks), "gap": r.gap} for r in fewer.itertuples()],
                }
            )
    return out


def lower_lr_cost(frame: pd.DataFrame) -> list[dict]:
    """Per reversible model and other peak lr: what that lr costs backprop itself against the
    study's, at each budget both ran (step decay, k = 1), beside PETRA's gap at the study's lr over
    the same budgets. In the delayed reference the delay costs less the lower the lr, so a delayed
    run's best lr is below backprop's, and PETRA's gap carries what that lower lr costs backprop.
    Only what the records hold."""
    out = []
    plain = (frame.k == 1) & (frame.span == 0) & (frame.blocks == 1) & (frame.decay == "step") & (frame.predict == 0)
    for rev, s in frame[plain & (frame.arch == frame.model)].groupby("model", sort=False):
        backprop = s[s.method == "backprop"]
        study = backprop[backprop.lr == 0].set_index("minibatches")
        petra = s[(s.method == "petra") & (s.lr == 0)].set_index("minibatches")
        for lr, other in backprop[backprop.lr != 0].groupby("lr"):
            other = other.set_index("minibatches")
            both = sorted(set(study.index) & set(other.index))
            if len(both) < 2:
                continue
            points = [
                {
                    "minibatches": int(b),
                    "cost": other.loc[b, "mean"] - study.loc[b, "mean"],
                    "err": _spread(other.loc[b, "std"], study.loc[b, "std"]),
                    "petra_gap": petra.loc[b, "gap"] if b in petra.index else None,
                }
                for b in both
            ]
            gaps = [p["petra_gap"] for p in points if p["petra_gap"] is not None]
            out.append(
                {
                    "model": model_label(rev),
                    "lr": float(lr),
                    "unit": UNITS[other["metric"].iloc[0]],
                    "points": points,
                    "grows": bool(abs(points[-1]["cost"]) > abs(points[0]["cost"])),
                    "petra_grows": bool(abs(gaps[-1]) > abs(gaps[0])) if len(gaps) >= 2 else None,
                }
            )
    return out


def memory_rows(results: pd.DataFrame) -> list[dict]:
    """Per (model, method): the bytes kept between forward and backward, over all stages and at the
    largest stage (measured by the run; the same for every seed and budget)."""
    mine = trained(results)
    mine = mine[mine.arch.isin([*TWINS, *TWINS.values()])]
    mine = mine.assign(span=spans(mine), predict=predictions(mine), blocks=blocks(mine))
    rows = []
    for (arch, method, span, predict, per_stage), g in mine.groupby(
        ["arch", "method", "span", "predict", "blocks"], sort=False
    ):
        r = g.iloc[0]
        rows.append(
            {
                "setting": _setting(arch, method, 1, span, predict=predict, per_stage=per_stage),
                "stages": int(r["num_stages"]),
                "total_mb": float(r["kept_total_mb"]),
                "max_mb": float(r["kept_max_mb"]),
                "params": int(r["params"]),
            }
        )
    return rows


def drift_rows(fidelity: pd.DataFrame) -> list[dict]:
    """Per reversible model and diagnostic run (a fidelity log): per stage, over the tracked steps
    of the run's second half, the median error of the input the stage computed its gradient at
    (‖x̂ − x‖ / ‖x‖: 0 where it keeps its input or graph) and the mean cosine of its stepped
    gradient with the true one."""
    if fidelity.empty or "input_error" not in fidelity.columns:
        return []
    out = []
    mine = fidelity[fidelity.arch.isin(list(TWINS))]
    mine = mine.assign(span=spans(mine))
    for (rev, method, k, span), g in mine.groupby(["arch", "method", "k", "span"], sort=False):
        late = g[g.step >= g.step.max() / 2]
        stages = late.groupby("stage").agg(kind=("kind", "first"), error=("input_error", "median"),
                                           cosine=("cosine", "mean"))  # fmt: skip
        out.append(
            {
                "model": rev,
                "setting": _setting(rev, method, int(k), int(span)),
                "steps": f"{int(late.step.min()):,}–{int(late.step.max()):,}",
                "stages": [
                    {
                        "stage": int(j),
                        "kind": r.kind,
                        "error": None if pd.isna(r.error) else float(r.error),
                        "cosine": float(r.cosine),
                    }
                    for j, r in stages.iterrows()
                ],  # fmt: skip
            }
        )
    return out


def _column(frame: pd.DataFrame, key: str, default) -> pd.Series:
    """``frame[key]`` with ``default`` where a row (or the whole file, from before the column) has none."""
    return frame.get(key, pd.Series(index=frame.index, dtype=object)).fillna(default)


def delay_rows(delays: pd.DataFrame) -> list[dict]:
    """benchmarks/delay_sensitivity.py's settings (the plain-PyTorch delayed-gradient reference, a
    delay per stage), each with its result (validation loss for a language model, top-1 for an
    image model: the row's ``metric``) and its cost against the setting it names as its baseline
    (the same model and recipe without delay, or for a recipe's own no-delay row the study's
    backprop), in the study's order."""
    if delays.empty:
        return []
    # rows measured before the cosine settings have no schedule (the study's steps), before the
    # RevViT settings no metric (validation loss), before the per-stage lr no delay_lr (one lr),
    # before beta2 was a setting's option no beta2 (their model's recipe's)
    delays = delays.assign(
        schedule=_column(delays, "schedule", "step"),
        metric=_column(delays, "metric", "test_loss"),
        delay_lr=_column(delays, "delay_lr", 0.0),
        beta2=_column(delays, "beta2", pd.NA).fillna(delays["arch"].map(REFERENCE_BETA2)),
    )
    by_name = delays.set_index("setting")
    out = []
    for r in delays.to_dict("records"):
        base = r.get("baseline")
        has_base = isinstance(base, str) and base in by_name.index
        metric = r["metric"]
        out.append(
            {
                "setting": r["setting"],
                "arch": r["arch"],
                "question": r["question"],
                "delays": r["delays"],
                "metric": metric,
                "value": float(r[metric]),
                "cost": float(r[metric] - by_name.loc[base, metric]) if has_base else None,
                "against": by_name.loc[base, "question"] if has_base else None,
                # a baseline with another recipe (lr 3e-4 without delay against backprop's lr 1e-3)
                "other_recipe": has_base
                and any(
                    k in r and r[k] != by_name.loc[base, k]
                    for k in ("lr", "beta1", "beta2", "predict", "delay_lr", "schedule")
                ),
                "minibatches": int(r["minibatches"]),
                "schedule": r["schedule"],
                "recipe": _recipe(r),
                "revision": str(r["git_revision"])[:7],
            }
        )
    return out


# The recipe of the delay reference's study (benchmarks/delay_sensitivity.py reads it from here): what
# a setting trains with unless it says otherwise, and what a row's recipe names its departures from.
# AdamW at lr 1e-3, beta1 0.9 and its model's beta2 (nanoGPT's 0.99 for the GPTs, minREV's 0.999 for
# the ViTs), step decay, no weight prediction, one lr for every stage (delay_lr 0).
REFERENCE_RECIPE = {"optimizer": "adamw", "lr": 1e-3, "beta1": 0.9, "predict": 0.0, "delay_lr": 0.0, "schedule": "step"}
REFERENCE_BETA2 = {"revgpt": 0.99, "gpt": 0.99, "revvit": 0.999, "vit": 0.999}


def _recipe(row: dict) -> str:
    """A delay row's optimizer, lr and schedule, and what else departs from the study's (AdamW's
    beta1 0.9 and its model's beta2, no weight prediction, one lr for every stage):
    ``adamw, lr 0.0001, step decay``,
    ``..., each stage's lr over its delay^0.5``; the defaults where a row
    (from before the column) has none."""

    def get(key, default=None):
        value = row.get(key)
        return REFERENCE_RECIPE.get(key, default) if value is None or pd.isna(value) else value

    text = f"{get('optimizer')}, lr {float(get('lr')):g}, {get('schedule')} decay"
    if get("optimizer") != "sgd" and float(get("beta1")) != REFERENCE_RECIPE["beta1"]:
        text += f", beta1 {float(get('beta1')):g}"
    model_beta2 = REFERENCE_BETA2.get(row.get("arch"))  # None for a model without a recipe's beta2: none said
    if get("optimizer") != "sgd" and model_beta2 is not None and float(get("beta2", model_beta2)) != model_beta2:
        text += f", beta2 {float(get('beta2')):g}"
    if float(get("predict")):
        text += f", weight prediction {float(get('predict')):g}"
    if float(get("delay_lr")):
        text += f", each stage's lr over its delay^{float(get('delay_lr')):g}"
    return text


def _harm(cost: float, metric: str) -> float:
    """How much a cost hurts: a loss that rises, a top-1 that falls."""
    return cost if metric == "test_loss" else -cost


def delay_summary(rows: list[dict]) -> dict:
    """What one model's delay rows say, from the rows: at the budget most of them ran, the least and
    the most the pipeline's delays cost (the delays most of the costed rows have) over the recipes
    tried; and, for each recipe measured at two budgets or more (one row a budget), the delay's
    cost at each budget, in order, whether it shrinks from the first to the last, and whether it
    turns: grows to its dearest budget before the last, then shrinks (per model: a twin's rows are
    a series of their own)."""
    costed = [r for r in rows if r["cost"] is not None and any(int(d) for d in r["delays"].split())]
    if not costed:
        return {"pipeline": None, "least": None, "most": None, "trends": []}
    patterns = pd.Series([r["delays"] for r in costed])
    pipeline = patterns.value_counts(sort=True).index[0]  # ties: the first seen
    mine = [r for r in costed if r["delays"] == pipeline]
    budget = pd.Series([r["minibatches"] for r in mine]).value_counts(sort=True).index[0]
    at = [r for r in mine if r["minibatches"] == budget]
    ranked = sorted(at, key=lambda r: _harm(r["cost"], r["metric"]))
    trends = []
    for arch, recipe in dict.fromkeys((r["arch"], r["recipe"]) for r in mine):
        same = [r for r in mine if (r["arch"], r["recipe"]) == (arch, recipe)]
        budgets = [r["minibatches"] for r in same]
        if len(set(budgets)) < 2 or len(set(budgets)) != len(budgets):
            continue  # one budget, or two settings of one recipe at a budget: no series
        series = sorted(same, key=lambda r: r["minibatches"])
        first, last = series[0], series[-1]
        peak = max(series, key=lambda r: _harm(r["cost"], r["metric"]))  # ties: the earliest
        trends.append(
            {
                "arch": arch,
                "recipe": recipe,
                "points": [{"minibatches": r["minibatches"], "cost": r["cost"]} for r in series],
                "shrinks": abs(last["cost"]) < abs(first["cost"]),
                "peak": {"minibatches": peak["minibatches"], "cost": peak["cost"]},
                "turns": peak is not first and peak is not last and abs(last["cost"]) < abs(peak["cost"]),
            }
        )
    return {"pipeline": pipeline, "minibatches": int(budget), "least": ranked[0], "most": ranked[-1], "trends": trends}


def delay_tables(rows: list[dict]) -> list[dict]:
    """:func:`delay_rows` in one table per result (validation loss, then top-1), in the rows' order."""
    tables: dict[str, list[dict]] = {}
    for r in rows:
        tables.setdefault(r["metric"], []).append(r)
    return [
        {
            "metric": METRICS[m],
            "model": model_label(mine[0]["arch"]),
            "digits": DIGITS[m],
            "revisions": list(dict.fromkeys(r["revision"] for r in mine)),
            "rows": mine,
            "summary": delay_summary(mine),
        }
        for m, mine in tables.items()
    ]


def transformers_context(frames: dict, profile: str) -> dict:
    summary, results = frames["summary"], frames["results"]
    context = {"profile": profile, "gathered": not summary.empty, "applies": applies(summary), "series": []}
    if not context["applies"]:
        return context
    frame = budget_frame(summary, results)
    for (dataset, rev), s in frame.groupby(["dataset", "model"], sort=False):
        metric = s.metric.iloc[0]
        settings = _variants(s, rev)
        budgets = []
        for minibatches, b in s.groupby("minibatches"):
            cells = {}
            for r in b.to_dict("records"):
                cells[_key(r)] = {
                    **_cell(r),
                    "gap": None if pd.isna(r["gap"]) else r["gap"],
                    "gap_err": r["gap_err"],
                }
            budgets.append({"minibatches": int(minibatches), "cells": [cells.get(a) for a in settings]})
        context["series"].append(
            {
                "dataset": dataset,
                "dataset_label": DATASET_LABELS.get(dataset, dataset),
                "model": model_label(rev),
                "metric": METRICS[metric],
                "digits": DIGITS[metric],
                "settings": [_setting(*a) for a in settings],
                "budgets": budgets,
            }
        )
    context["goals"] = goals(frame)
    context["gap_split"] = where_the_gap_is(frame)
    context["lower_lr"] = lower_lr_cost(frame)
    context["memory"] = memory_rows(results)
    context["drift"] = drift_rows(frames.get("fidelity", pd.DataFrame()))
    context["delays"] = delay_tables(delay_rows(frames.get("delays", pd.DataFrame())))
    context["setting"] = describe_runs(results)
    return context


# a line's style by method, beside its colour by setting: solid backprop, dashed PETRA, dotted
# delayed gradients, dash-dot DSP; the twin's backprop solid with square markers
METHOD_LINES = {"backprop": "-", "petra": "--", "delayed": ":", "dsp": "-."}


def _line_style(arch: str, method: str, rev: str) -> dict:
    return {"linestyle": METHOD_LINES.get(method, (0, (5, 1, 1, 1, 1, 1))), "marker": "o" if arch == rev else "s"}


def transformers_figure(frames: dict, profile: str):
    """Per (dataset, model): the final metric against the training budget (minibatches, log scale),
    a line per setting and the twin's backprop (mean ± sd over seeds; its colour the setting's, its
    style the method's), and the learning curves of the largest budget."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from .plotting import empty_figure

    summary, results, history = frames["summary"], frames["results"], frames["history"]
    if not applies(summary):
        return empty_figure(f"results of profile {profile} hold no reversible transformer (revgpt, revvit)")
    frame = budget_frame(summary, results)
    series = list(frame.groupby(["dataset", "model"], sort=False))
    fig, axes = plt.subplots(len(series), 2, figsize=(11, 3.8 * len(series)), squeeze=False)
    for row, ((dataset, rev), s) in zip(axes, series):
        metric = s.metric.iloc[0]
        s = s.assign(setting=[_setting(*_key(r)) for r in s.to_dict("records")])
        variants = _variants(s, rev)
        order = [_setting(*a) for a in variants]
        # the default palette has 10 colours and repeats after them: more settings take evenly spaced hues,
        # and neighbouring hues come close, so a line's style says its method too
        palette = sns.color_palette(None if len(order) <= 10 else "husl", n_colors=len(order))
        colors = dict(zip(order, palette))
        styles = {setting: _line_style(a[0], a[1], rev) for setting, a in zip(order, variants)}
        for setting in order:
            g = s[s.setting == setting].sort_values("minibatches")
            row[0].errorbar(
                g.minibatches, g["mean"], yerr=g["std"].fillna(0), capsize=3, label=setting, color=colors[setting],
                **styles[setting],
            )  # fmt: skip
        row[0].set_xscale("log", base=2)
        row[0].set(
            xlabel="training budget (minibatches)", ylabel=METRICS[metric], title=f"{model_label(rev)}: at the end"
        )
        largest = s.epochs.max()
        runs = results[
            results.arch.isin([rev, TWINS[rev]]) & (results.dataset == dataset) & (results.epochs == largest)
        ]
        h = history[history.run_dir.isin(runs.run_dir)].dropna(subset=[metric]).copy()
        steps = dict(zip(runs.run_dir, runs.optimizer_steps * runs.k / runs.epochs_done))
        h["minibatches"] = h.epoch * [steps[d] for d in h.run_dir]
        h["setting"] = [_setting(*a) for a in settings_of(h)]
        curves = set(h.setting)
        for setting in [o for o in order if o in curves]:
            sns.lineplot(
                data=h[h.setting == setting], x="minibatches", y=metric, color=colors[setting], errorbar="sd",
                markersize=3, ax=row[1], **styles[setting],
            )  # fmt: skip
        row[1].set(xlabel="minibatches", ylabel=METRICS[metric], title=f"{model_label(rev)}: the largest budget")
        # one legend for the row (both panels share its colours), beside it: inside, a dozen
        # settings cover the curves
        if row[1].get_legend() is not None:
            row[1].get_legend().remove()
        row[1].legend(*row[0].get_legend_handles_labels(), fontsize="x-small", loc="upper left",
                      bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)  # fmt: skip
    fig.suptitle(f"PETRA on reversible transformers (profile {profile}; mean ± sd over seeds)", y=1.01)
    fig.tight_layout()
    return fig
