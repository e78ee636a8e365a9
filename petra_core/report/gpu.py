"""Table 1's "measured on GPU" section, README's GPU block and docs/reproducing.md's measured GPU
hours, from ``benchmarks/bench_gpu.py``'s files (``results/gpu/<GPU>.json``) and the evidence
committed beside each (``results/gpu/<GPU>/``).

Table 1: one row per (GPU, model, stem, settings, method): the synced time per minibatch, its
ratio to backprop's at the same model and settings, the host's enqueue time per tick (a row where
it approaches the synced time is CPU-bound) and the device's peak memory; an out-of-memory is a
row of its own, with the bytes it tried to allocate. Where the GPU's folder holds
``plain_and_syncs.json`` (``benchmarks/probes/gpu_probe.py``), a second table sets the engine
beside a plain PyTorch loop over the same model. No file, no section: the table says that no GPU
has measured it yet, and how to.

README and docs/reproducing.md (:func:`summary`): per GPU whose folder holds one-epoch CIFAR-10
runs (``cifar10_1epoch_METHOD.json``, a run's ``metrics.json``), their images/s and what they
give for the paper profile's CIFAR-10 epochs; PETRA ÷ backprop step time; and how much of each
pipelined method's synced time per minibatch the host spends enqueueing its tick. What no record
says (the revision and date of the measurement, each one-epoch run's config) is in the folder's
``provenance.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import labels

PROVENANCE = "provenance.json"  # {"revision", "date", "runs": {file: the run's config}}
PLAIN = "plain_and_syncs.json"  # benchmarks/probes/gpu_probe.py
EPOCH_RUNS = "cifar10_1epoch_*.json"  # one real CIFAR-10 epoch per method: the run's metrics.json
PLAIN_LABEL = "plain PyTorch"  # bench_gpu.py's baseline row: the same model as one module, one optimizer
PAPER_PROFILE = "paper"  # the profile whose CIFAR-10 epochs the measured rates are turned into hours


def _read(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def load(gpu_dir: str | Path | None) -> list[dict]:
    """Every benchmark file in ``gpu_dir`` (sorted by name), each with the evidence of its folder
    ``results/gpu/NAME/`` under ``"evidence"`` (``name``; ``provenance``, ``plain`` and ``epochs``:
    {file name: record}; None or {} where the folder lacks them); [] where there is no file."""
    if gpu_dir is None or not Path(gpu_dir).is_dir():
        return []
    out = []
    for path in sorted(Path(gpu_dir).glob("*.json")):
        folder = path.with_suffix("")
        evidence = {
            "name": path.stem,
            "provenance": _read(folder / PROVENANCE),
            "plain": _read(folder / PLAIN),
            "epochs": {p.name: json.loads(p.read_text()) for p in sorted(folder.glob(EPOCH_RUNS))},
        }
        out.append({**json.loads(path.read_text()), "evidence": evidence})
    return out


def _setting(r: dict, batch: int | None) -> tuple:
    """What a row's time compares within: its model, settings, batch and phases (a file from before
    bench_gpu.py measured several batches or phases has one batch, the file's, and eager phases)."""
    return (r["arch"], r["stem"], r["settings"], r.get("batch", batch), r.get("phases", "eager"))


def _rows(measured: list[dict], batch: int | None = None) -> list[dict]:
    base = {
        _setting(r, batch): r["s_per_batch"]
        for r in measured
        if r["method"] == "backprop" and r.get("s_per_batch") and r.get("devices", 1) == 1
    }
    rows = []
    for r in measured:
        method = PLAIN_LABEL if r["method"] == "plain" else labels.METHOD_LABELS.get(r["method"], r["method"])
        if r.get("devices", 1) > 1:
            method += f" ({r['devices']} GPUs)"
        if r.get("phases", "eager") != "eager":
            method += f" ({r['phases']} phases)"
        settings = r["settings"] if r.get("batch", batch) == batch else f"{r['settings']}, batch {r['batch']}"
        row = {
            "arch": r["arch"],
            "key": r["method"],
            "model": labels.model_label(r["arch"]),
            "stem": r["stem"],
            "settings": settings,
            "method": method,
            "devices": r.get("devices", 1),
            "oom": bool(r.get("oom")),
            "error": r.get("error") if not r.get("oom") else None,
        }
        if r.get("s_per_batch"):
            b = base.get(_setting(r, batch))
            row.update(
                ms=1e3 * r["s_per_batch"],
                host_ms=1e3 * r["host_s_per_tick"],
                ratio=r["s_per_batch"] / b if b else None,
                peak_gib=(r.get("device_peak_bytes") or 0) / 2**30,
            )
        elif row["oom"]:
            row["tried_gib"] = (r.get("tried_bytes") or 0) / 2**30
        rows.append(row)
    return rows


def _plain(plain: dict | None) -> list[dict]:
    """The plain-PyTorch comparison's rows, in ms and ratios (the rows that failed left out)."""
    return [
        {
            "model": labels.model_label(r["arch"]),
            "batch": r["batch"],
            "settings": r["settings"],
            "plain_ms": 1e3 * r["plain_s"],
            "backprop": r.get("backprop_over_plain"),
            "petra": r.get("petra_over_plain"),
        }
        for r in (plain or {}).get("plain_vs_engine", [])
        if "plain_s" in r
    ]


def gpu_context(files: list[dict]) -> dict:
    """``{"measured": bool, "devices": [{"device", "torch", "cuda", "width", "batch", "revision",
    "date", "rows", "plain"}]}``."""
    devices = []
    for f in files:
        provenance = f.get("evidence", {}).get("provenance") or {}
        devices.append(
            {
                "device": f.get("device", "?"),
                "torch": f.get("torch"),
                "cuda": f.get("cuda"),
                "width": f.get("width"),
                "batch": f.get("batch"),
                "revision": provenance.get("revision"),
                "date": provenance.get("date"),
                "rows": _rows(f.get("rows", []), f.get("batch")),
                "plain": _plain(f.get("evidence", {}).get("plain")),
            }
        )
    return {"measured": bool(devices), "devices": devices}


# ---- README's GPU block and docs/reproducing.md's GPU hours -------------------------------------
def paper_cifar10() -> dict:
    """The paper profile's CIFAR-10 runs per method: ``{method: {"epochs", "batch_size"}}``."""
    from ..workflow.grid import load_profile

    out = {}
    for block in load_profile(PAPER_PROFILE)["grid"]:
        if block.get("dataset") == "cifar10":
            out.setdefault(block["method"], {"epochs": block["epochs"], "batch_size": block["batch_size"]})
    return out


def _epoch_runs(f: dict, paper: dict) -> list[dict]:
    """Each one-epoch run's rate and what it gives for the paper profile's epochs of its method."""
    evidence = f["evidence"]
    configs = (evidence["provenance"] or {}).get("runs", {})
    out = []
    for name, m in evidence["epochs"].items():
        if name not in configs:
            raise ValueError(f"{name}: no config in {PROVENANCE} (its 'runs' name {sorted(configs) or 'none'})")
        c = configs[name]
        images_per_epoch = m["optimizer_steps"] * c["k"] * c["batch_size"] / m["epochs"]
        target = paper.get(c["method"], {})
        epochs = target.get("epochs")
        out.append(
            {
                "key": c["method"],
                "method": labels.METHOD_LABELS.get(c["method"], c["method"]),
                "model": labels.model_label(c["arch"]),
                "width": c["width"],
                "batch": c["batch_size"],
                "k": c["k"],
                "images_per_s": m["images_per_s"],
                "paper_epochs": epochs,
                "paper_batch": target.get("batch_size"),
                "hours": epochs * images_per_epoch / m["images_per_s"] / 3600 if epochs else None,
                "hours_with_eval": epochs * m["wall_time_s"] / m["epochs"] / 3600 if epochs else None,
            }
        )
    return sorted(out, key=lambda r: labels.METHOD_ORDER.index(r["key"]) if r["key"] in labels.METHOD_ORDER else 99)


def _host_share(rows: list[dict]) -> dict | None:
    """Over every pipelined method's row (one tick per minibatch, one GPU): the host's enqueue time
    per tick as a share of the synced time per minibatch, least and most; None without such a row."""
    from ..methods import METHODS

    timed = [r for r in rows if "ms" in r and r["devices"] == 1 and r["key"] in METHODS]
    pipelined = [r for r in timed if not METHODS[r["key"]].schedule.fixed_weights_in_flight]
    if not pipelined:
        return None
    shares = [r["host_ms"] / r["ms"] for r in pipelined]
    methods = [m for m in labels.METHOD_ORDER if m in {r["key"] for r in pipelined}]
    return {"least": min(shares), "most": max(shares), "methods": [labels.METHOD_LABELS[m] for m in methods]}


def summary(gpu_dir: str | Path) -> list[dict]:
    """Per GPU whose folder holds one-epoch CIFAR-10 runs: what README's GPU block and
    docs/reproducing.md's GPU hours say (:func:`_epoch_runs`, PETRA ÷ backprop per model and
    setting, the host's share, PETRA's host and synced ms per setting on the first model)."""
    files = [f for f in load(gpu_dir) if f["evidence"]["epochs"]]
    paper = paper_cifar10() if files else {}
    out = []
    for f, device in zip(files, gpu_context(files)["devices"]):
        petra = [r for r in device["rows"] if r["key"] == "petra" and r["devices"] == 1 and "ms" in r]
        models = list(dict.fromkeys((r["model"], r["stem"]) for r in petra))
        out.append(
            {
                **{k: device[k] for k in ("device", "torch", "cuda", "revision", "date", "width", "batch")},
                "name": f["evidence"]["name"],
                "epochs": _epoch_runs(f, paper),
                "petra": [
                    {"model": m, "stem": s, "rows": [r for r in petra if (r["model"], r["stem"]) == (m, s)]}
                    for m, s in models
                ],
                "host": _host_share(device["rows"]),
            }
        )
    return out
