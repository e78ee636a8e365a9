"""Figures (seaborn) from the tidy results and the cached cost measurements; PNG and PDF, byte-stable.

* ``fig4_accumulation``  top-1 vs accumulation k for the pipelined methods, backprop as a line (Fig. 4);
* ``training_curves``    training loss and test top-1 per epoch, per method and k (mean ± sd over seeds);
* ``memory_per_stage``   bytes each stage keeps between forward and backward, per method (from the runs);
* ``gradient_fidelity``  cosine of each delayed gradient with the true one (the runs' ``fidelity.csv``,
  or the cached simulated sample in ``results/costs/fidelity.csv`` when no run logged one);
* ``budget_gap``         top-1 gap to backprop against the number of minibatches trained, for a
  profile of several budgets, with the paper's CIFAR-10 budget marked (``budget.py``).

A profile of several budgets is drawn at its largest in the other figures.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from ..run import runio  # noqa: E402
from ..workflow.studies import STUDIES_DIR  # noqa: E402
from . import labels  # noqa: E402
from .budget import METRICS, at_largest_budget, gap_frame, paper_point, trend, trend_curve, varies_budget  # noqa: E402
from .plotting import empty_figure  # noqa: E402

# the selected profile's figures; every other figure is a study's (workflow/studies/*.yaml)
FIGURES = ("fig4_accumulation", "training_curves", "memory_per_stage", "gradient_fidelity", "budget_gap")
FORMATS = {"png": {"dpi": 150, "metadata": {"Software": None}}, "pdf": {"metadata": {"CreationDate": None}}}
PIPELINED = ("delayed", "dsp", "petra")


def style() -> None:
    sns.set_theme(context="paper", style="whitegrid", font_scale=1.0)
    plt.rcParams.update({"svg.hashsalt": "petra", "pdf.compression": 6, "figure.max_open_warning": 0})


def save(fig, out_dir: Path, name: str) -> list[Path]:
    """``fig`` as ``name``.png and .pdf in ``out_dir``, each written whole or not at all (a
    temporary file renamed over the old one: an interrupted render never leaves half a figure)."""
    paths = []
    for fmt, kw in FORMATS.items():
        path = out_dir / f"{name}.{fmt}"
        runio.atomic_write(path, lambda f, fmt=fmt, kw=kw: fig.savefig(f, format=fmt, bbox_inches="tight", **kw))
        paths.append(path)
    plt.close(fig)
    return paths


def _panels(keys: list, width: float = 4.2, height: float = 3.2):
    fig, axes = plt.subplots(1, max(1, len(keys)), figsize=(width * max(1, len(keys)), height), squeeze=False)
    return fig, list(axes[0])


def accumulation_metric(summary: pd.DataFrame) -> tuple[str, str]:
    """The paper averages top-1 over the last 10 epochs; for runs of under 20 epochs that would mix
    in the first epochs, so the final top-1 is used instead (said on the axis)."""
    if not summary.empty and summary.epochs.min() >= 20:
        return "top1_last10_mean", "top-1 (%), mean of the evaluations in the last 10 epochs"
    return "top1", "top-1 (%), last epoch"


def fig4_accumulation(summary: pd.DataFrame, profile: str):
    metric, ylabel = accumulation_metric(summary)
    pipelined = summary[summary.method.isin(PIPELINED)]
    keys = sorted({(r.dataset, r.arch) for r in pipelined.itertuples()})
    if not keys:
        return empty_figure(f"profile {profile}: no pipelined runs")
    fig, axes = _panels(keys)
    palette = dict(zip(PIPELINED, sns.color_palette("deep", 4)[1:]))
    for ax, (dataset, arch) in zip(axes, keys):
        sub = pipelined[(pipelined.dataset == dataset) & (pipelined.arch == arch)].sort_values("k")
        for method, g in sub.groupby("method", sort=False):
            ax.errorbar(
                g.k,
                g[f"{metric}_mean"],
                yerr=g[f"{metric}_std"].fillna(0),
                marker="o",
                capsize=3,
                color=palette[method],
                label=labels.METHOD_LABELS[method],
            )
        bp = summary[(summary.dataset == dataset) & (summary.arch == arch) & (summary.method == "backprop")]
        if not bp.empty:
            mean, std = bp[f"{metric}_mean"].iloc[0], bp[f"{metric}_std"].iloc[0]
            ax.axhline(mean, color="black", ls="--", lw=1, label=f"Backprop (n = {int(bp.n.iloc[0])})")
            if pd.notna(std):
                ax.axhspan(mean - std, mean + std, color="black", alpha=0.08)
        ks = sorted(sub.k.unique())
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.minorticks_off()
        ax.set(
            xlabel="accumulation k",
            ylabel=ylabel,
            title=f"{labels.model_label(arch)}, {labels.DATASET_LABELS.get(dataset, dataset)}",
        )
        ax.legend(fontsize="small")
    fig.suptitle(f"Accumulation: pipelined methods vs backprop (profile {profile}; paper: Fig. 4)", y=1.02)
    return fig


def training_curves(history: pd.DataFrame, profile: str):
    if history.empty:
        return empty_figure(f"profile {profile}: no runs")
    h = history.assign(
        run=[
            labels.run_label(m, k) + f", {labels.model_label(a)}"
            for m, k, a in zip(history.method, history.k, history.arch)
        ]
    )
    datasets = list(h.dataset.unique())
    fig, axes = plt.subplots(len(datasets), 2, figsize=(10, 3.4 * len(datasets)), squeeze=False)
    for row, dataset in zip(axes, datasets):
        sub = h[h.dataset == dataset]
        for ax, (y, name) in zip(row, [("train_loss", "training loss"), ("top1", "test top-1 (%)")]):
            sns.lineplot(
                data=sub, x="epoch", y=y, hue="run", errorbar="sd", marker="o", markersize=3, ax=ax, legend=ax is row[1]
            )
            ax.set(ylabel=name, title=f"{labels.DATASET_LABELS.get(dataset, dataset)}: {name}")
        row[1].legend(fontsize="x-small", loc="best")
    fig.suptitle(f"Training curves (profile {profile}; mean ± sd over seeds)", y=1.01)
    fig.tight_layout()
    return fig


def memory_per_stage(memory: pd.DataFrame, profile: str):
    if memory.empty:
        return empty_figure(f"profile {profile}: no runs")
    m = memory.groupby(["dataset", "arch", "width", "method", "k", "stage", "kind"], as_index=False).kept_bytes.mean()
    m = m.assign(
        kept_mb=m.kept_bytes / 1e6,
        run=[labels.run_label(a, b) for a, b in zip(m.method, m.k)],
        stage_label=[f"{s}:{k}" for s, k in zip(m.stage, m.kind)],
    )
    keys = sorted({(r.dataset, r.arch, r.width) for r in m.itertuples()})
    fig, axes = _panels(keys, width=5.5, height=3.4)
    for ax, (dataset, arch, width) in zip(axes, keys):
        sub = m[(m.dataset == dataset) & (m.arch == arch) & (m.width == width)]
        order = sub.drop_duplicates("stage").sort_values("stage").stage_label
        sns.barplot(data=sub, x="stage_label", y="kept_mb", hue="run", order=order, ax=ax)
        ax.set(
            xlabel="stage:kind (S stem, R reversible, D downsampling, B ResNet block, H head)",
            ylabel="kept between fwd and bwd (MB)",
            title=f"{labels.model_label(arch)} width {width}, {labels.DATASET_LABELS.get(dataset, dataset)}",
        )
        if len(order) > 12:  # 18 stages: labels side by side would overlap
            ax.tick_params(axis="x", labelrotation=90, labelsize="small")
        ax.legend(fontsize="x-small")
    fig.suptitle(f"Memory per stage and method, measured in training (profile {profile})", y=1.02)
    return fig


def gradient_fidelity(fidelity: pd.DataFrame, profile: str, fallback: pd.DataFrame | None):
    source = f"runs of profile {profile}"
    data = fidelity
    if data.empty:
        if fallback is None or fallback.empty:
            return empty_figure(f"profile {profile}: no fidelity data (set fidelity_every > 0)")
        data, source = fallback, "simulated sample (results/costs/fidelity.csv), no run of the profile logged fidelity"
    data = data.assign(label=[labels.METHOD_LABELS.get(m, m) for m in data.method])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
    sns.lineplot(data=data, x="step", y="cosine", hue="label", errorbar=None, marker="o", markersize=4, ax=left)
    left.set(xlabel="optimizer step", ylabel="cosine to the true gradient", title="over training (mean over stages)")
    sns.barplot(data=data, x="stage", y="cosine", hue="label", errorbar=None, ax=right)
    right.set(xlabel="stage", ylabel="mean cosine", title="per stage (mean over steps)")
    low = max(0.0, float(data.cosine.min()) - 0.05)
    for ax in (left, right):
        ax.set_ylim(low, 1.005)
        ax.legend(fontsize="x-small")
    fig.suptitle(f"Gradient fidelity of delayed gradients — {source}", y=1.02)
    return fig


SERIES_COLORS = {"petra": 2, "delayed": 1, "dsp": 3, "revbackprop": 4}


def budget_gap(summary: pd.DataFrame, results: pd.DataFrame, profile: str, reference: dict):
    if summary.empty or not varies_budget(summary):
        return empty_figure(
            f"profile {profile} trains one budget per run: no gap-vs-budget curve (the budget profile has one)"
        )
    frame = gap_frame(summary, results)
    paper = paper_point(reference)
    fig, axes = _panels(list(METRICS), width=5.2, height=3.8)
    palette = sns.color_palette("deep", 10)
    archs = (
        list(dict.fromkeys(frame.sort_values("num_stages").arch))
        if "num_stages" in frame
        else list(frame.arch.unique())
    )
    several = len(archs) > 1  # one series per depth: RevNet18's 10 stages, RevNet34's and RevNet50's 18
    for ax, (metric, what) in zip(axes, METRICS.items()):
        for (arch, method, k), g in frame.groupby(["arch", "method", "k"], sort=True):
            depth = archs.index(arch)
            color = (
                palette[(SERIES_COLORS.get(method, 5) + 3 * depth) % len(palette)]
                if several
                else palette[SERIES_COLORS.get(method, 5)]
            )
            name = labels.run_label(method, k)
            if several:
                name = f"{labels.model_label(arch)} ({int(g.num_stages.iloc[0])} stages): {name}"
            ax.errorbar(
                g.minibatches,
                g[f"gap_{metric}"],
                yerr=g[f"gap_{metric}_err"].fillna(0),
                capsize=3,
                marker="os^D"[depth % 4] if k == 1 else "s",
                ls=["-", "--", "-."][depth % 3] if len(g) > 1 else "none",
                color=color,
                label=name + (f" (n = {int(g.n.max())})" if g.n.max() > 1 else ""),
            )
            fit = trend(frame, method, k, paper["minibatches"], metric, arch=arch)
            if fit is not None and fit["kind"] != "closed":
                xs = np.geomspace(g.minibatches.max(), paper["minibatches"], 20)
                ax.plot(
                    xs,
                    trend_curve(fit, xs),
                    ls=":",
                    color=color,  # the panels' trends differ: the label says which
                    label=f"{name}: trend, {fit['predicted_gap']:+.2f} at the paper's budget ({what})",
                )
        ax.axhline(0, color="black", lw=1)
        ax.scatter(
            [paper["minibatches"]],
            [paper["gap"]],
            marker="*",
            s=160,
            color="black",
            zorder=5,
            label=f"paper: CIFAR-10, {paper['epochs']} epochs (~{paper['minibatches']:,} minibatches)",
        )
        ax.set_xscale("log")
        ax.set(
            xlabel="minibatches trained (log scale)", ylabel="top-1 minus backprop's (points)", title=f"top-1 {what}"
        )
    # one legend below both panels: inside one, a dozen series hid the points they name
    entries = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    fig.legend(
        list(entries.values()),
        list(entries),
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=2,
        fontsize="x-small",
        frameon=False,
    )
    first = frame.iloc[0]
    models = ", ".join(labels.model_label(a) for a in archs)
    fig.suptitle(
        f"Gap to backprop against training budget — {models} width "
        f"{int(first.width)}, {labels.DATASET_LABELS.get(first.dataset, first.dataset)} (profile {profile}; "
        f"error bars: sd over seeds)",
        y=1.02,
    )
    return fig


def draw_all(
    results_dir: str | Path,
    costs_dir: str | Path,
    out_dir: str | Path,
    profile: str,
    studies_dir: str | Path = STUDIES_DIR,
    study_dirs: dict[str, str | Path] | None = None,
) -> list[Path]:
    """Draw ``FIGURES`` of the selected profile and every study's figures (``studies_dir``; a study
    reads its declared results directory, or ``study_dirs[name]``) into ``out_dir``."""
    from ..reference import load_paper_reference
    from ..workflow.studies import load_all
    from . import costs as costs_mod
    from . import results as results_mod
    from . import studies as studies_mod

    style()
    frames = results_mod.load(results_dir)
    fallback = costs_mod.load(costs_dir)["fidelity"]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary, history = frames["summary"], frames["history"]
    figs = {
        "fig4_accumulation": fig4_accumulation(at_largest_budget(summary), profile),
        "training_curves": training_curves(at_largest_budget(history), profile),
        "memory_per_stage": memory_per_stage(frames["memory"], profile),
        "gradient_fidelity": gradient_fidelity(frames["fidelity"], profile, fallback),
        "budget_gap": budget_gap(summary, frames["results"], profile, load_paper_reference()),
    }
    for name, fig in studies_mod.figures(load_all(studies_dir), study_dirs).items():
        if name in figs:
            raise ValueError(f"a study declares figure {name!r}, one of the profile's {list(FIGURES)}")
        figs[name] = fig
    return [path for name, fig in figs.items() for path in save(fig, out_dir, name)]
