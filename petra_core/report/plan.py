"""The planner's answers (``results/plan/answers/answers.json``, written by ``petra plan answers``): the
table of time per epoch, speedup, memory, fewest devices and largest model per model, cluster and
method, with where each number comes from; the closed-form memory of delayed gradients (PipeDream's
optimizer and the paper's Table 1) beside the planner's; and the figure of speedup against devices.

Only formatting here: every number is the record's (the planner computed it, from the committed
GPU profile and the cluster cards), so the table changes only when the record does.
"""

from __future__ import annotations

import json
from pathlib import Path

ANSWERS = "answers.json"
GIB, MIB = 2**30, 2**20
EXTRA_LABELS = {"gpipe": "GPipe", "1f1b": "1F1B"}  # the synchronous baselines (not methods of the paper)
METHOD_ORDER = ("backprop", "gpipe", "1f1b", "delayed", "dsp", "petra")


def load(plan_dir: str | Path | None) -> dict | None:
    """The answers record, or None where nothing was computed."""
    path = Path(plan_dir or "") / ANSWERS
    return json.loads(path.read_text()) if plan_dir is not None and path.exists() else None


def method_label(method: str) -> str:
    from . import labels

    return EXTRA_LABELS.get(method) or labels.METHOD_LABELS.get(method, method)


def _order(method: str) -> int:
    return METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER)


def _largest(record: dict, stem: str, cluster: str, method: str) -> str:
    """``RevNet34 × 2048 (21.8 B params) on 8`` or '–' (GPipe, 1F1B: none searched; nothing fits)."""
    from . import labels

    found = [x for x in record["largest"] if (x["stem"], x["cluster"], x["method"]) == (stem, cluster, method)]
    if not found or "arch" not in found[0]:
        return "–"
    x = found[0]
    return f"{labels.model_label(x['arch'])} width {x['width']} ({x['params'] / 1e9:.2f} B params, {x['devices']} dev.)"


def _fewest(record: dict, arch: str, cluster: str, method: str) -> str:
    found = [f for f in record["fewest"] if (f["arch"], f["cluster"], f["method"]) == (arch, cluster, method)]
    if not found:
        return "–"
    f = found[0]
    return (
        "none fits" if f["devices"] is None else f"{f['devices']}" + (f" ({f['k']}×{f['microbatch']})" * (f["k"] > 1))
    )


def _phases(profile: str) -> str:
    """The method whose phase times a row uses (``... phases of backprop)`` -> ``backprop``)."""
    return profile.rsplit("phases of ", 1)[-1].rstrip(")").split(" (")[0]


def answer_rows(record: dict) -> list[dict]:
    """One row per model, cluster and method: one device, the fastest layout on the whole cluster,
    one pipeline over G = min(J, devices) devices (speedup vs J), memory per device, fewest devices,
    largest model. A method without a profile row keeps its fewest and largest columns."""
    from . import labels

    frame = {}
    for r in record["rows"]:
        frame.setdefault((r["arch"], r["cluster"], r["method"]), []).append(r)
    keys = {(f["arch"], f["cluster"], f["method"]) for f in record["fewest"]} | set(frame)
    stems = {r["arch"]: r["stem"] for r in record["formulas"]}
    clusters = record["provenance"]["clusters"]
    rows = []
    for arch, cluster, method in sorted(keys, key=lambda x: (x[0], clusters.index(x[1]), _order(x[2]))):
        rs = frame.get((arch, cluster, method), [])
        piped = [r for r in rs if r["layout"] == "pipeline"]
        best = [r for r in rs if r["layout"] == "best"]
        one = piped[0] if piped else None
        top = max(best, key=lambda r: (r["devices"], r["samples_per_s"])) if best else None
        wide = piped[-1] if piped else None
        rows.append(
            dict(
                model=labels.model_label(arch), cluster=cluster, method=method_label(method),
                profiled=bool(rs), phases=_phases(rs[0]["profile"]) if rs else "no profile row",
                epoch_one=one and one["seconds_per_epoch"], devices=top and top["devices"],
                layout=top and f"{top['devices'] // top['replicas']}×{top['replicas']}",
                epoch_best=top and top["seconds_per_epoch"], speedup_best=top and top["speedup"],
                pipeline_devices=wide and wide["devices"], epoch_pipeline=wide and wide["seconds_per_epoch"],
                speedup_pipeline=wide and wide["speedup"], bubble=wide and 100 * wide["bubble_fraction"],
                memory_gib=wide and wide["peak_bytes"] / GIB, fits=None if wide is None else wide["fits"],
                fewest=_fewest(record, arch, cluster, method),
                largest=_largest(record, stems.get(arch, ""), cluster, method),
            )
        )  # fmt: skip
    return rows


def formula_rows(record: dict) -> tuple[list[dict], list[dict]]:
    """Delayed gradients per stage (in flight, A, W; PipeDream's, the paper's and the planner's
    bytes), and per model and method the paper's Table 1 memory terms summed over the stages."""
    from . import labels

    per_stage = [
        dict(
            model=labels.model_label(f["arch"]), stage=f["stage"], J=f["J"], in_flight_paper=2 * (f["J"] - f["stage"]),
            in_flight_pipedream=f["J"] - f["stage"], stash_copies=f["stash_copies"],
            activation_mib=f["kept_bytes"] / MIB, weight_mib=f["weight_bytes"] / MIB,
            pipedream_mib=f["pipedream_bytes"] / MIB,
            paper_mib=(f["activations_bytes"] + f["params_bytes"]) / MIB, planner_mib=f["planner_bytes"] / MIB,
        )
        for f in record["formulas"]
        if f["method"] == "delayed"
    ]  # fmt: skip
    sums: dict[tuple, dict] = {}
    for f in record["formulas"]:
        s = sums.setdefault(
            (f["arch"], f["method"]),
            dict(model=labels.model_label(f["arch"]), method=method_label(f["method"]),
                 activations=f["activations_expr"], params=f["params_expr"], paper_activation_gib=0.0,
                 paper_params_gib=0.0, planner_gib=0.0),
        )  # fmt: skip
        s["paper_activation_gib"] += f["activations_bytes"] / GIB
        s["paper_params_gib"] += f["params_bytes"] / GIB
        s["planner_gib"] += f["planner_bytes"] / GIB
    return per_stage, list(sums.values())


def plan_context(record: dict | None) -> dict:
    """What ``plan.{md,tex}`` shows: the answers, the closed forms beside the planner, provenance."""
    if record is None:
        return {"applies": False, "rows": [], "stages": [], "terms": [], "provenance": {}, "missing": []}
    stages, terms = formula_rows(record)
    first = record["formulas"][0] if record["formulas"] else {}
    return {
        "applies": True,
        "rows": answer_rows(record),
        "stages": stages,
        "terms": terms,
        "provenance": record["provenance"],
        "missing": record["missing"],
        "shape": {"width": first.get("width"), "batch": first.get("batch"), "k": first.get("k")},
        "batch_for_min": record["fewest"][0]["batch"] if record["fewest"] else None,
    }


def plan_figure(record: dict | None):
    """Predicted speedup against devices, a line per method (solid: one pipeline split over G
    devices; dashed: the fastest pipeline × replicas), a panel per model and cluster."""
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    from . import labels
    from .plotting import empty_figure

    if record is None or not record["rows"]:
        return empty_figure("no planner answers (petra plan answers --out results/plan/answers/answers.json)")
    frame = pd.DataFrame(record["rows"]).assign(
        method=lambda f: f.method.map(method_label),
        layout=lambda f: f.layout.map({"pipeline": "one pipeline over G", "best": "fastest P × R = G"}),
    )
    archs, clusters = list(dict.fromkeys(frame.arch)), record["provenance"]["clusters"]
    order = [method_label(m) for m in sorted(set(r["method"] for r in record["rows"]), key=_order)]
    fig, axes = plt.subplots(len(archs), len(clusters), figsize=(4.4 * len(clusters), 3.4 * len(archs)), squeeze=False)
    for row, arch in zip(axes, archs):
        for ax, cluster in zip(row, clusters):
            sub = frame[(frame.arch == arch) & (frame.cluster == cluster)]
            sns.lineplot(data=sub, x="devices", y="speedup", hue="method", hue_order=order, style="layout",
                         style_order=["one pipeline over G", "fastest P × R = G"], marker="o", markersize=3, ax=ax,
                         legend=ax is axes[0][0])  # fmt: skip
            ax.set(xlabel="devices G", ylabel="speedup over one device", title=f"{labels.model_label(arch)}, {cluster}")
    axes[0][0].legend(fontsize="x-small", loc="upper left")
    p = record["provenance"]
    fig.suptitle(f"Predicted speedup (petra plan; profile {p['profile']}, {p['settings']}; revision {p['revision']})",
                 y=1.01)  # fmt: skip
    fig.tight_layout()
    return fig
