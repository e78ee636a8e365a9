"""``petra plot RUN_DIR [RUN_DIR ...] --out FILE.png``: a reviewer's look at runs, from their records.

Loss, accuracy and learning rate against epoch, one line per run labelled by its run directory,
read from each run's ``history.json`` only (no results table, no profile), so any record, committed
or just trained, can be looked at or compared with another. Training quantities are drawn solid
at every epoch; the test quantities (test loss, top-1) dashed with markers, at the epochs the run
evaluated. The file is byte-stable (no software or date in its metadata), like the report's figures.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..run import runio  # noqa: E402

FORMATS = {".png": {"dpi": 150, "metadata": {"Software": None}}, ".pdf": {"metadata": {"CreationDate": None}}}
# panel -> (training key, test key or None, axis label)
PANELS = (
    ("train_loss", "test_loss", "loss"),
    ("train_acc", "top1", "accuracy (%)"),
    ("lr", None, "learning rate"),
)


def read_history(run_dir: Path) -> list[dict]:
    path = run_dir / runio.HISTORY
    if not path.is_file():
        raise ValueError(f"{run_dir} is not a recorded run: it has no {runio.HISTORY}")
    history = runio.read_json(path)
    if not isinstance(history, list) or not history:
        raise ValueError(f"{path} holds no epochs: a run's history is a list of one record per epoch")
    return history


def _series(history: list[dict], key: str) -> tuple[list, list]:
    points = [(row["epoch"], row[key]) for row in history if row.get(key) is not None]
    return [e for e, _ in points], [v for _, v in points]


def plot_runs(run_dirs: list[str | Path], out: str | Path) -> Path:
    """Draw the runs' curves into ``out`` (.png or .pdf); returns its path."""
    out = Path(out)
    if out.suffix not in FORMATS:
        raise ValueError(f"--out {str(out)!r}: the file's suffix must be one of {', '.join(FORMATS)}")
    histories = {str(Path(d)): read_history(Path(d)) for d in run_dirs}
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.4), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, history) in enumerate(histories.items()):
        color = colors[i % len(colors)]
        for ax, (train_key, test_key, _) in zip(axes[0], PANELS):
            ax.plot(*_series(history, train_key), color=color, label=label)
            if test_key is not None:
                ax.plot(*_series(history, test_key), color=color, linestyle="--", marker="o", markersize=3)
    for ax, (train_key, test_key, ylabel) in zip(axes[0], PANELS):
        ax.set_xlabel("epoch")
        ax.set_ylabel(ylabel)
        ax.set_title(train_key + (f" (solid), {test_key} (dashed)" if test_key else ""), fontsize=9)
        ax.grid(alpha=0.3)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=1, fontsize=8, bbox_to_anchor=(0.5, -0.02 * len(names)))
    fig.tight_layout(rect=(0, 0.06 * len(names), 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    runio.atomic_write(out, lambda f: fig.savefig(f, format=out.suffix[1:], bbox_inches="tight", **FORMATS[out.suffix]))
    plt.close(fig)
    return out


def cmd_plot(args) -> int:
    print(plot_runs(args.run_dirs, args.out))
    return 0
