"""``petra verify RUN_DIR``: retrain the first epochs of a recorded run at the current code and
compare them, epoch by epoch, with its record.

The verdict is "bit-identical" or the differences, key by key, and beside it whether bit identity
was to be expected. It is only expected where nothing that changes floating-point results
differs between the record's machine and this one: the code revision, torch, the CPU's kernel
set (``torch.backends.cpu.get_cpu_capability()``) and model, the number of threads, the device
(and on CUDA the GPU, CUDA and cuDNN). Each of those is compared from the record's ``env.json``;
one the record does not hold (a record older than these fields) is "unknown".

The report also says which quantities each epoch compared: an epoch without test evaluation holds
no test loss or top-1 on either side, so "bit-identical" there speaks for training loss, training
accuracy and learning rate only, and a reader must see that.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from . import runio
from .config import RunConfig

TIMING = {
    "images_per_s",
    "wall_time_s",
    "eval_time_s",
    "bn_reestimate_time_s",
    "population_eval_time_s",
}  # differ run to run
# what decides a run's bits, as env.json names it; "gpus", "cuda", "cudnn" only on CUDA
# what a history holds only on the epochs the test set is evaluated
TEST_EVALUATION = ("test_loss", "top1", "top5", "test_bpc", "test_ppl", "test_acc")  # images; text
DECISIVE = ("git_revision", "torch", "cpu_capability", "cpu_model", "torch_threads", "device", "gpus", "cuda", "cudnn")


def expectations(recorded: dict, now: dict) -> list[dict]:
    """Per decisive field: its value in the record and here, and whether they agree (None: unknown)."""
    rows = []
    for key in DECISIVE:
        if key in ("gpus", "cuda", "cudnn") and recorded.get("device") != "cuda" and now.get("device") != "cuda":
            continue
        was, is_ = recorded.get(key), now.get(key)
        same = None if was is None else was == is_
        if key == "git_revision" and was is not None and str(was).endswith("-dirty"):
            same = False  # a dirty revision names no code anyone can check out
        rows.append({"key": key, "record": was, "here": is_, "same": same})
    return rows


def compared(recorded: list[dict], now: list[dict], epochs: int) -> list[dict]:
    """Per epoch, the quantities compared (a value on either side; timings and the epoch number
    left out) and those neither side holds (None in both: nothing was compared)."""
    rows = []
    for e in range(epochs):
        a, b = recorded[e], now[e]
        keys = [k for k in dict.fromkeys([*a, *b]) if k not in TIMING and k != "epoch"]
        held = [k for k in keys if a.get(k) is not None or b.get(k) is not None]
        rows.append({"epoch": e + 1, "compared": held, "absent": [k for k in keys if k not in held]})
    return rows


def compared_line(row: dict) -> str:
    """``epoch 1: compared train_loss, train_acc, lr (no test evaluation this epoch)``."""
    notes, absent = [], row["absent"]
    evaluated = [k for k in TEST_EVALUATION if k in row["compared"]]
    if not evaluated and set(TEST_EVALUATION) & set(absent):  # none of the test quantities was held
        notes.append("no test evaluation this epoch")
        absent = [k for k in absent if k not in TEST_EVALUATION]
    if absent:
        notes.append(f"neither side holds {', '.join(absent)}")
    note = f" ({'; '.join(notes)})" if notes else ""
    return f"epoch {row['epoch']}: compared {', '.join(row['compared']) or 'nothing'}{note}"


def differences(recorded: list[dict], now: list[dict], epochs: int) -> list[dict]:
    """Every (epoch, key) whose value differs, with both values; [] when bit-identical."""
    diffs = []
    for e in range(epochs):
        a, b = recorded[e], now[e]
        for key in sorted((set(a) | set(b)) - TIMING):
            if a.get(key) != b.get(key):
                row = {"epoch": e + 1, "key": key, "record": a.get(key), "here": b.get(key)}
                if isinstance(a.get(key), (int, float)) and isinstance(b.get(key), (int, float)):
                    row["difference"] = b[key] - a[key]
                diffs.append(row)
    return diffs


def verify(
    run_dir: str | Path, epochs: int = 1, overrides: list[str] = (), work_dir: str | Path | None = None, log=print
) -> dict:
    """Retrain ``epochs`` epochs of ``run_dir``'s config (+ ``overrides``) in ``work_dir`` (a temporary
    directory by default) and compare with the record. Returns the report (see :func:`format_report`)."""
    from .trainer import train

    run_dir = Path(run_dir)
    for name in (runio.CONFIG, runio.HISTORY):
        if not (run_dir / name).exists():
            raise ValueError(f"{run_dir} is not a recorded run: it has no {name}")
    recorded = runio.read_json(run_dir / runio.HISTORY)
    if not isinstance(epochs, int) or not 1 <= epochs <= len(recorded):
        raise ValueError(
            f"--epochs {epochs!r} is not allowed; the record has {len(recorded)} epoch(s): 1..{len(recorded)}"
        )
    cfg = RunConfig.load(run_dir / runio.CONFIG, overrides=["progress=false", *overrides])
    env = runio.read_json(run_dir / runio.ENV) if (run_dir / runio.ENV).exists() else {}
    with tempfile.TemporaryDirectory(prefix="petra-verify-", dir=work_dir) as tmp:
        log(f"{run_dir}: retraining {epochs} of {len(recorded)} epoch(s) at the current code in {tmp}")
        train(cfg, Path(tmp) / "run", log=log, until_epoch=epochs)
        now_env = json.loads((Path(tmp) / "run" / runio.ENV).read_text())
        now = json.loads((Path(tmp) / "run" / runio.HISTORY).read_text())
    diffs = differences(recorded, now, epochs)
    expect = expectations(env, now_env)
    if overrides:
        expect.append({"key": "config", "record": "as recorded", "here": " ".join(overrides), "same": False})
    return {
        "run_dir": str(run_dir),
        "epochs": epochs,
        "identical": not diffs,
        "compared": compared(recorded, now, epochs),
        "differences": diffs,
        "expected": all(r["same"] for r in expect),
        "expectations": expect,
    }


def format_report(report: dict) -> str:
    lines = []
    if report["identical"]:
        lines.append(f"{report['run_dir']}: bit-identical over {report['epochs']} epoch(s)")
    else:
        lines.append(f"{report['run_dir']}: differs from its record over {report['epochs']} epoch(s):")
        for d in report["differences"]:
            extra = f" ({d['difference']:+.6g})" if "difference" in d else ""
            lines.append(f"  epoch {d['epoch']} {d['key']}: record {d['record']!r}, here {d['here']!r}{extra}")
    lines.extend(f"  {compared_line(row)}" for row in report["compared"])
    lines.append(
        "bit identity was expected: everything that decides the bits is the same"
        if report["expected"]
        else "bit identity was not guaranteed: what decides the bits differs or is not recorded"
    )
    for r in report["expectations"]:
        mark = {True: "same", False: "differs", None: "unknown (not in the record)"}[r["same"]]
        if r["key"] == "git_revision" and str(r["record"]).endswith("-dirty"):
            mark = "the record's is dirty (uncommitted changes: no revision holds its code)"
        lines.append(f"  {r['key']}: {mark}" + ("" if r["same"] else f" (record {r['record']!r}, here {r['here']!r})"))
    return "\n".join(lines)
