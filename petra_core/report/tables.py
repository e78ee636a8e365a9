"""Tables 1–3 of the paper, ours beside the paper's, rendered with Jinja2 (Markdown and LaTeX booktabs).

Each table is a context built from the tidy results (``results/PROFILE/*.csv``), the cached cost
measurements (``results/costs/``) and the paper's reference file, rendered by one template per
table and format (``templates/tableN_*.{md,tex}.j2``). Templates use ``StrictUndefined``: a value
missing from the context is an error, never a blank cell.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from ..reference import load_paper_reference
from ..run import runio
from ..workflow import studies
from ..workflow.studies import STUDIES_DIR
from . import labels
from .budget import DRAWS, METRICS, MODEL, at_largest_budget, gap_frame, paper_point, trend, varies_budget
from .labels import describe_runs

TEMPLATES = Path(__file__).parent / "templates"
# the paper's tables, rendered from the selected profile and the cost measurements; every other
# table is a study's (workflow/studies/*.yaml, petra_core.report.studies)
TABLES = {
    "table1_costs": "Table 1",
    "table2_accuracy": "Table 2",
    "table3_memory": "Table 3",
    "budget_gap": "the gap against training budget",
}
FORMATS = ("md", "tex")
QUANTITIES = ("activations", "params", "comm", "flops", "time")


def environment(*extra: str | Path) -> Environment:
    """Jinja2 over the report's templates; ``extra`` directories (a study's) are searched first."""
    env = Environment(
        loader=FileSystemLoader([*map(str, extra), str(TEMPLATES)]),
        undefined=StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(
        num=labels.num,
        pm=labels.pm,
        signed=labels.signed,
        millions=labels.millions,
        expr=labels.pretty_expr,
        formula=labels.formula,
        tex=labels.tex,
    )
    return env


def render(name: str, fmt: str, context: dict, templates: str | Path | None = None) -> str:
    """Render ``{name}.{fmt}.j2`` of ``templates`` or the report's (StrictUndefined: a missing value raises)."""
    env = environment(*([templates] if templates else []))
    return env.get_template(f"{name}.{fmt}.j2").render(**context)


# ---- contexts -----------------------------------------------------------------------------------
def _row_order(method: str, arch: str) -> tuple:
    depth = int("".join(c for c in arch if c.isdigit()))
    family = 0 if arch.startswith("resnet") else 1
    order = labels.METHOD_ORDER.index(method) if method in labels.METHOD_ORDER else 99
    return method in labels.LOCAL_LEARNING, depth, family if method in labels.LOCAL_LEARNING else order, order, family


def pick_k(group: pd.DataFrame, runs: pd.DataFrame) -> pd.Series:
    """The summary row (one k) a method is reported at: the k with the best final training accuracy,
    as the paper picks PETRA's k on the training set. The ks are compared on the seeds they were all
    run with (a paired comparison: a k with an extra seed is not judged on it), ties -> smaller k."""
    if len(group) == 1:
        return group.iloc[0]
    seeds = [set(runs[runs.k == k].seed) for k in group.k]
    common = set.intersection(*seeds) or set.union(*seeds)
    shared = runs[runs.seed.isin(common)]
    score = {int(k): shared[shared.k == k].train_acc.mean() for k in group.k}
    best = min(score, key=lambda k: (-score[k], k))
    return group[group.k == best].iloc[0]


def table2_context(frames: dict, profile: str, reference: dict | None = None) -> dict:
    """Our column: the profile's runs, at its largest budget where it has several."""
    ref = (reference or load_paper_reference())["table2"]
    summary, results = at_largest_budget(frames["summary"]), at_largest_budget(frames["results"])
    datasets = [
        {"key": d, "label": labels.DATASET_LABELS.get(d, d), "paper": d in ref["datasets"]}
        for d in summary.dataset.unique()
    ]
    paper_rows = {(r["method"], r["arch"]): r for r in ref["rows"] if r.get("variant") != "hub"}
    rows = []
    for (method, arch), g in summary.groupby(["method", "arch"], sort=False):
        paper = paper_rows.get((method, arch), {})
        cells, ks = {}, {}
        for d in datasets:
            sub = g[g.dataset == d["key"]]
            if sub.empty:
                cells[d["key"]] = {"paper": paper.get(d["key"]), "mean": None, "std": None, "n": 0}
                continue
            best = pick_k(
                sub, results[(results.dataset == d["key"]) & (results.method == method) & (results.arch == arch)]
            )
            ks[d["key"]] = (int(best.k), sorted(int(k) for k in sub.k))
            cells[d["key"]] = {
                "paper": paper.get(d["key"]),
                "mean": best.top1_mean,
                "std": best.top1_std,
                "n": int(best.n),
            }
        budget = results[(results.method == method) & (results.arch == arch)]
        k_best = sorted({k for k, _ in ks.values()})
        k_tried = sorted({k for _, tried in ks.values() for k in tried})
        rows.append(
            {
                "method": method,
                "arch": arch,
                "method_label": labels.METHOD_LABELS.get(method, method),
                "local": method in labels.LOCAL_LEARNING,
                "model": labels.model_label(arch),
                "params_paper": paper.get("params_m"),
                "params_ours": int(g.params.iloc[0]),
                "k": "/".join(map(str, k_best)),
                "k_tried": ", ".join(map(str, k_tried)),
                "cells": cells,
                "minibatches": int((budget.optimizer_steps * budget.k).max()) if not budget.empty else None,
            }
        )
    _gaps_to_backprop(rows, datasets)
    rows.sort(key=lambda r: _row_order(r["method"], r["arch"]))
    seeds = {d["key"]: ref["seeds"].get(d["key"]) for d in datasets}
    return {
        "profile": profile,
        "setting": describe_runs(results),
        "datasets": datasets,
        "rows": rows,
        "varies_budget": varies_budget(frames["summary"]),
        "gaps": any(r["method"] != "backprop" for r in rows),
        "paper_source": ref["source"],
        "paper_seeds": seeds,
        "k_choices": ", ".join(map(str, ref["k_choices"])),
    }


def _gaps_to_backprop(rows: list[dict], datasets: list[dict]) -> None:
    """Each method's cell gains its gap to backprop on the same model (ours: at the same budget, the
    model's largest), beside the paper's same gap: the number the paper's Table 2 is read for."""
    backprop = {r["arch"]: r for r in rows if r["method"] == "backprop"}
    for r in rows:
        base = backprop.get(r["arch"]) if r["method"] != "backprop" else None
        for d in datasets:
            cell, ref = r["cells"][d["key"]], base["cells"][d["key"]] if base else None
            same_budget = base is not None and base["minibatches"] == r["minibatches"]
            cell["gap"] = (
                cell["mean"] - ref["mean"]
                if same_budget and not labels.missing(cell["mean"]) and not labels.missing(ref["mean"])
                else None
            )
            cell["paper_gap"] = (
                cell["paper"] - ref["paper"]
                if ref is not None and cell["paper"] is not None and ref["paper"] is not None
                else None
            )


def table1_context(costs: dict, reference: dict | None = None) -> dict:
    ref = (reference or load_paper_reference())["table1"]
    t1, info = costs["table1"], costs["info"]
    first = t1.iloc[0]
    s = info["settings"]["table1"]
    stages = costs["table1_per_stage"]
    kind = stages[stages.stage == int(first.stage)].kind.iloc[0]
    rows, notes = [], []
    extra = [m for m in labels.METHOD_ORDER if m in set(t1.method) and m not in ref["methods"]]
    for method in [m for m in ref["methods"] if m in set(t1.method)] + extra:  # the paper's, then local learning
        g = t1[t1.method == method].set_index("quantity")
        label = ref["methods"][method]["label"] if method in ref["methods"] else labels.METHOD_LABELS[method]
        cells = {
            q: {
                "expr": "" if pd.isna(g.at[q, "paper_expr"]) else g.at[q, "paper_expr"],
                "paper": float(g.at[q, "paper"]),
                "ours": float(g.at[q, "measured"]),
            }
            for q in QUANTITIES
        }
        rows.append({"method": method, "label": label, "cells": cells, "paper": method in ref["methods"]})
        for q in QUANTITIES:
            note = g.at[q, "note"]
            if isinstance(note, str) and note.strip():
                notes.append({"label": label, "quantity": q, "text": note.strip()})
    return {
        "rows": rows,
        "notes": notes,
        "columns": ref["columns"],
        "paper_source": ref["source"],
        "arch": labels.model_label(s["arch"]),
        "stem": s["stem"],
        "image_size": s["image_size"],
        "width": s["width"],
        "batch": s["batch"],
        "k": s["k"],
        "J": int(first.J),
        "j": int(first.j),
        "kind": kind,
        "machine": info["machine"],
    }


def _run_keys(frame: pd.DataFrame) -> list[str]:
    """What tells a summary row's runs apart from the others (epochs only where the profile has it)."""
    return [k for k in ("dataset", "arch", "width", "method", "k", "epochs") if k in frame.columns]


def _kept_by_stage_kind(memory: pd.DataFrame) -> dict[tuple, dict[str, float]]:
    """MB kept by a run's reversible stages and by the others (stem, downsampling, head), mean over
    seeds: Table 3's claim is that PETRA's reversible stages keep nothing."""
    if memory.empty:
        return {}
    m = memory.assign(part=["reversible" if k == "R" else "other" for k in memory.kind])
    keys = _run_keys(memory)
    per_run = m.groupby(keys + ["seed", "part"], as_index=False).kept_bytes.sum()
    mean = per_run.groupby(keys + ["part"]).kept_bytes.mean() / 1e6
    out: dict[tuple, dict[str, float]] = {}
    for (*key, part), mb in mean.items():
        out.setdefault(tuple(key), {})[part] = float(mb)
    for key, n in memory.groupby(keys).stage.nunique().items():
        out[key]["stages"] = int(n)
    return out


def table3_context(costs: dict, frames: dict | None, profile: str | None, reference: dict | None = None) -> dict:
    ref = (reference or load_paper_reference())["table3"]
    t3 = costs["table3"]
    acc = {a: g.set_index("row") for a, g in t3.groupby("accounting")}
    rows = []
    for i, paper_row in enumerate(ref["rows"], start=1):
        rows.append(
            {
                "row": i,
                "input_buffer": paper_row["input_buffer"],
                "param_buffer": paper_row["param_buffer"],
                **{
                    a: {"gb": float(acc[a].at[i, "memory_gb"]), "saving": float(acc[a].at[i, "saving_pct"])}
                    for a in ("paper", "formula", "real", "real_no_stem", "real_engine")
                },
            }
        )
    bias_mb = 1e3 * (acc["formula_conv_bias"].memory_gb - acc["formula"].memory_gb).abs().max()
    stem_gb = float(acc["real"].at[1, "memory_gb"] - acc["real_no_stem"].at[1, "memory_gb"])
    first = t3.iloc[0]
    measured = []
    if frames is not None and not frames["summary"].empty:
        s = at_largest_budget(frames["summary"])
        by_kind = _kept_by_stage_kind(at_largest_budget(frames["memory"]))
        for r in s[s.arch.str.startswith("revnet")].itertuples():
            kinds = by_kind.get(tuple(getattr(r, key) for key in _run_keys(s)), {})
            measured.append(
                {
                    "dataset": labels.DATASET_LABELS.get(r.dataset, r.dataset),
                    "model": labels.model_label(r.arch),
                    "width": int(r.width),
                    "method": labels.METHOD_LABELS.get(r.method, r.method),
                    "k": int(r.k),
                    "stages": kinds.get("stages"),
                    "reversible_mb": kinds.get("reversible"),
                    "other_mb": kinds.get("other"),
                    "total_mb": r.kept_total_mb_mean,
                    "max_mb": r.kept_max_mb_mean,
                    "n": int(r.n),
                }
            )
        measured.sort(key=lambda m: (m["model"], m["method"], m["k"]))
        backprop = {
            (m["dataset"], m["model"], m["width"]): m["total_mb"] for m in measured if m["method"] == "Backprop"
        }
        for m in measured:  # what a method keeps against backprop's kept graph, same model
            base = backprop.get((m["dataset"], m["model"], m["width"]))
            m["vs_backprop"] = m["total_mb"] / base if base else None
    petra = [
        m
        for m in measured
        if m["method"] == labels.METHOD_LABELS.get("petra", "petra") and m["reversible_mb"] is not None
    ]
    return {
        "rows": rows,
        "arch": labels.model_label(ref["arch"]),
        "batch": int(first.batch),
        "k": int(first.k),
        "image_size": int(first.image_size),
        "J": int(first.num_stages),
        "paper_source": ref["source"],
        "params_ours": int(costs["info"]["table3_params"]),
        "params_authors": int(ref["params_authors"]),
        "bias_mb": float(bias_mb),
        "stem_gb": stem_gb,
        "measured": measured,
        "profile": profile,
        "petra_reversible_max_mb": max((m["reversible_mb"] for m in petra), default=None),
        "petra_models": "; ".join(dict.fromkeys(f"{m['model']}, {m['stages']} stages" for m in petra)),
    }


def budget_context(frames: dict, profile: str, reference: dict | None = None) -> dict:
    """Per model (one per depth: RevNet18's 10 stages, RevNet34's and RevNet50's 18) and training
    budget: backprop, every other method's top-1 and its gap, as trained and with batch-norm
    statistics re-estimated; the trend of each gap, extrapolated to the paper's budget."""
    reference = reference or load_paper_reference()
    summary = frames["summary"]
    paper = paper_point(reference)
    context = {
        "profile": profile,
        "applies": varies_budget(summary),
        "paper": paper,
        "metrics": METRICS,
        "models": [],
        "setting": "",
        "draws": DRAWS,
    }
    if not context["applies"]:
        return context
    frame = gap_frame(summary, frames["results"])
    if frame.empty:
        return context
    for (_, arch, _), g in frame.groupby(MODEL, sort=False):
        context["models"].append(_budget_model(g, arch, paper))
    context["models"].sort(key=lambda m: (m["num_stages"] or 0, m["arch"]))
    context["setting"] = describe_runs(frames["results"])
    return context


def _budget_model(frame: pd.DataFrame, arch: str, paper: dict) -> dict:
    """One model's gap-against-budget rows and trends."""
    series = [(m, int(k)) for m, k in frame[["method", "k"]].drop_duplicates().itertuples(index=False)]
    series.sort(key=lambda s: (labels.METHOD_ORDER.index(s[0]) if s[0] in labels.METHOD_ORDER else 99, s[1]))
    stages = frame.num_stages.iloc[0] if "num_stages" in frame else None
    model = {
        "arch": arch,
        "model": labels.model_label(arch),
        "num_stages": None if pd.isna(stages) else int(stages),
        "series": [{"label": labels.run_label(m, k), "method": m, "k": k} for m, k in series],
        "rows": [],
        "trends": [],
    }
    for (minibatches, epochs), g in frame.groupby(["minibatches", "epochs"], sort=True):
        first = g.iloc[0]
        row = {"minibatches": int(minibatches), "epochs": int(epochs), "cells": {}}
        for metric in METRICS:
            row["cells"][metric] = {
                "backprop": {
                    "mean": first[f"backprop_{metric}"],
                    "std": first[f"backprop_{metric}_std"],
                    "n": int(first.backprop_n),
                },
                "series": [_series_cell(g, m, k, metric) for m, k in series],
            }
        model["rows"].append(row)
    for m, k in series:
        for metric in METRICS:
            fit = trend(frame, m, k, paper["minibatches"], metric, arch=arch)
            if fit is not None:
                model["trends"].append({**fit, "label": labels.run_label(m, k), "metric": METRICS[metric]})
    return model


def _series_cell(g: pd.DataFrame, method: str, k: int, metric: str) -> dict:
    r = g[(g.method == method) & (g.k == k)]
    if r.empty:
        return {"mean": None, "std": None, "n": 0, "gap": None, "gap_err": None}
    r = r.iloc[0]
    return {
        "mean": r[metric],
        "std": r[f"{metric}_std"],
        "n": int(r.n),
        "gap": r[f"gap_{metric}"],
        "gap_err": r[f"gap_{metric}_err"],
    }


# ---- rendering ----------------------------------------------------------------------------------
def render_all(
    results_dir: str | Path,
    costs_dir: str | Path,
    out_dir: str | Path,
    profile: str,
    gpu_dir: str | Path | None = None,
    studies_dir: str | Path = STUDIES_DIR,
    study_dirs: dict[str, str | Path] | None = None,
) -> list[Path]:
    """Write the paper's tables (``TABLES``) and every study's (``studies_dir``), ``.md`` and
    ``.tex``, into ``out_dir``; returns the paths.

    Table 1's GPU section reads ``gpu_dir`` (``bench_gpu.py``'s files; none when None); a study's
    tables read its declared results directory, or ``study_dirs[name]``."""
    from . import costs as costs_mod
    from . import gpu as gpu_mod
    from . import results as results_mod
    from . import studies as studies_mod

    frames = results_mod.load(results_dir)
    costs = costs_mod.load(costs_dir)
    reference = load_paper_reference()
    contexts = {
        "table1_costs": {**table1_context(costs, reference), "gpu": gpu_mod.gpu_context(gpu_mod.load(gpu_dir))},
        "table2_accuracy": table2_context(frames, profile, reference),
        "table3_memory": table3_context(costs, frames, profile, reference),
        "budget_gap": budget_context(frames, profile, reference),
    }
    templates = dict.fromkeys(contexts)
    for name, (study, context) in studies_mod.contexts(studies.load_all(studies_dir), study_dirs).items():
        if name in TABLES:
            raise ValueError(f"study {study.name!r} declares table {name!r}, one of the paper's {sorted(TABLES)}")
        contexts[name], templates[name] = context, study.templates
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, context in contexts.items():
        for fmt in FORMATS:
            path = out_dir / f"{name}.{fmt}"
            runio.write_text(path, render(name, fmt, context, templates[name]))  # whole or not at all
            paths.append(path)
    return paths
