"""Where a run's epoch records go besides ``history.json``: a CSV file or TensorBoard (``logger``).

``history.json`` stays the one record petra reads back; a logger is a view of it for the user's own
tools (a spreadsheet, pandas, TensorBoard). Each writer is handed the whole history at every epoch's
end, so a resumed run's file is the same as an uninterrupted one's: the CSV is rewritten atomically
from the history; TensorBoard is told to drop any step at or after the first epoch it has not seen
(``purge_step``), which discards what a killed run wrote after its last checkpoint.
"""

from __future__ import annotations

import csv
import importlib.util
import io
from pathlib import Path

from . import runio

LOGGERS = ("none", "csv", "tensorboard")
CSV_FILE = "history.csv"  # logger=csv
TENSORBOARD_DIR = "tensorboard"  # logger=tensorboard: event files, `tensorboard --logdir RUN_DIR`


def tensorboard_missing(logger: str) -> str | None:
    """The one line that refuses ``logger=tensorboard`` where the package is not installed."""
    if logger == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
        return "logger='tensorboard' needs the tensorboard package (pip install tensorboard); or use logger=csv"
    return None


def history_csv(history: list[dict]) -> str:
    """The history as CSV: a row per epoch, a column per key in first-seen order; an epoch without
    a value (no test evaluation that epoch) leaves its cell empty."""
    columns: list[str] = []
    for entry in history:
        columns += [key for key in entry if key not in columns and not isinstance(entry[key], (dict, list))]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for entry in history:
        writer.writerow({key: "" if entry.get(key) is None else entry[key] for key in columns})
    return out.getvalue()


class CsvLogger:
    """``history.csv`` in the run directory, rewritten from the whole history at each epoch."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / CSV_FILE

    def write(self, history: list[dict]) -> None:
        runio.write_text(self.path, history_csv(history))

    def close(self) -> None:
        pass


class TensorBoardLogger:
    """Each epoch's numbers as scalars (``train/…``, ``test/…``, ``lr``, ``images_per_s``), step =
    epoch. Made lazily at the first epoch written, so a run that never ends an epoch leaves no file."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir) / TENSORBOARD_DIR
        self.writer = None
        self.written = 0  # epochs already sent in this process

    def write(self, history: list[dict]) -> None:
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.written = len(history) - 1  # this process has seen none but the newest
            self.writer = SummaryWriter(str(self.dir), purge_step=history[-1]["epoch"])
        for entry in history[self.written :]:
            for key, value in entry.items():
                if key != "epoch" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.writer.add_scalar(scalar_tag(key), value, global_step=entry["epoch"])
        self.written = len(history)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def scalar_tag(key: str) -> str:
    """``train_loss`` → ``train/loss``, ``test_loss`` → ``test/loss``, ``top1`` → ``test/top1``:
    TensorBoard groups a run's curves by the part before the slash."""
    for prefix in ("train", "test"):
        if key.startswith(prefix + "_"):
            return f"{prefix}/{key[len(prefix) + 1 :]}"
    return f"test/{key}" if key.startswith("top") else key


class NoLogger:
    def __init__(self, run_dir: Path):
        pass

    def write(self, history: list[dict]) -> None:
        pass

    def close(self) -> None:
        pass


def make_logger(logger: str, run_dir: Path):
    """The writer for the config's ``logger`` key."""
    return {"none": NoLogger, "csv": CsvLogger, "tensorboard": TensorBoardLogger}[logger](run_dir)
