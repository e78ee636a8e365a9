"""Cyclic execution (``results/cyclic/``, written by ``petra cyclic``): the table of peaks, means and
devices, and the figure of memory and gradient traffic over one step, DP against CDP."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..run.runio import CYCLIC_FILES


def load(cyclic_dir: str | Path | None) -> dict | None:
    """{"profile", "summary": DataFrame, "info": dict}, or None where nothing was measured."""
    if cyclic_dir is None or not all((Path(cyclic_dir) / name).exists() for name in CYCLIC_FILES):
        return None
    d = Path(cyclic_dir)
    return {
        "profile": pd.read_csv(d / "cyclic_profile.csv"),
        "summary": pd.read_csv(d / "cyclic_summary.csv"),
        "info": json.loads((d / "cyclic.json").read_text()),
    }


def cyclic_context(measured: dict | None) -> dict:
    """What ``cyclic.{md,tex}`` shows: per model and variant, MB held and sent per slot, devices."""
    from . import labels

    if measured is None:
        return {"applies": False, "rows": [], "settings": {}}
    mb = 2**20
    rows = [
        {
            "model": labels.model_label(r.arch),
            "variant": r.variant,
            "activation_peak": r.activation_peak / mb,
            "activation_mean": r.activation_mean / mb,
            "activation_vs_dp": r.activation_peak_vs_dp,
            "activation_peak_to_mean": r.activation_peak_to_mean,
            "grad_peak": r.grad_peak / mb,
            "grad_mean": r.grad_mean / mb,
            "grad_peak_to_mean": r.grad_peak_to_mean,
            "grad_slots": f"{int(r.grad_slots_busy)} / {int(r.slots)}",
            "devices": int(r.devices),
            "devices_dp": int(r.devices_dp),
        }
        for r in measured["summary"].itertuples()
    ]
    return {"applies": True, "rows": rows, "settings": measured["info"]["settings"]}


def cyclic_figure(measured: dict | None):
    """Activation bytes held and gradient bytes sent per time slot over one step, a line per variant."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from . import labels
    from .plotting import empty_figure

    if measured is None:
        return empty_figure("no cyclic-execution measurement (petra cyclic --out results/cyclic)")
    frame = measured["profile"]
    frame = frame[frame.in_window].assign(
        activation_mb=lambda f: f.activation_bytes / 2**20, grad_mb=lambda f: f.grad_bytes / 2**20
    )
    archs = list(frame.arch.unique())
    fig, axes = plt.subplots(len(archs), 2, figsize=(10, 3.2 * len(archs)), squeeze=False)
    for row, arch in zip(axes, archs):
        sub = frame[frame.arch == arch]
        for ax, (y, name) in zip(
            row, [("activation_mb", "activations held (MB, all replicas)"), ("grad_mb", "gradient bytes sent (MB)")]
        ):
            sns.lineplot(
                data=sub,
                x="slot",
                y=y,
                hue="variant",
                marker="o",
                markersize=3,
                ax=ax,
                legend=ax is row[0],
                drawstyle="steps-mid" if y == "grad_mb" else "default",
            )
            ax.set(xlabel="time slot within one step", ylabel=name, title=f"{labels.model_label(arch)}: {name}")
        row[0].legend(fontsize="x-small", loc="best")
    s = measured["info"]["settings"]
    fig.suptitle(
        f"Cyclic execution: {s['replicas']} replicas, batch {s['batch']}, width {s['width']} "
        f"(measured in the simulator)",
        y=1.01,
    )
    fig.tight_layout()
    return fig
