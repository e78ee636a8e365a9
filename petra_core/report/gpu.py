"""Table 1's "measured on GPU" section, from ``benchmarks/bench_gpu.py``'s files (``results/gpu/*.json``).

One row per (GPU, model, stem, settings, method): the synced time per minibatch, its ratio to
backprop's at the same model and settings, the host's enqueue time per tick (a row where it
approaches the synced time is CPU-bound) and the device's peak memory; an out-of-memory is a
row of its own, with the bytes it tried to allocate. No file, no section: the table says that
no GPU has measured it yet, and how to.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import labels


def load(gpu_dir: str | Path | None) -> list[dict]:
    """Every benchmark file in ``gpu_dir`` (sorted by name); [] where there is none."""
    if gpu_dir is None or not Path(gpu_dir).is_dir():
        return []
    return [json.loads(p.read_text()) for p in sorted(Path(gpu_dir).glob("*.json"))]


def gpu_context(files: list[dict]) -> dict:
    """``{"measured": bool, "devices": [{"device", "torch", "cuda", "width", "batch", "rows"}]}``."""
    devices = []
    for f in files:
        rows = []
        measured = f.get("rows", [])
        base = {
            (r["arch"], r["stem"], r["settings"]): r["s_per_batch"]
            for r in measured
            if r["method"] == "backprop" and r.get("s_per_batch") and r.get("devices", 1) == 1
        }
        for r in measured:
            method = labels.METHOD_LABELS.get(r["method"], r["method"])
            if r.get("devices", 1) > 1:
                method += f" ({r['devices']} GPUs)"
            row = {
                "model": labels.model_label(r["arch"]),
                "stem": r["stem"],
                "settings": r["settings"],
                "method": method,
                "oom": bool(r.get("oom")),
                "error": r.get("error") if not r.get("oom") else None,
            }
            if r.get("s_per_batch"):
                b = base.get((r["arch"], r["stem"], r["settings"]))
                row.update(
                    ms=1e3 * r["s_per_batch"],
                    host_ms=1e3 * r["host_s_per_tick"],
                    ratio=r["s_per_batch"] / b if b else None,
                    peak_gib=(r.get("device_peak_bytes") or 0) / 2**30,
                )
            elif row["oom"]:
                row["tried_gib"] = (r.get("tried_bytes") or 0) / 2**30
            rows.append(row)
        devices.append(
            {
                "device": f.get("device", "?"),
                "torch": f.get("torch"),
                "cuda": f.get("cuda"),
                "width": f.get("width"),
                "batch": f.get("batch"),
                "rows": rows,
            }
        )
    return {"measured": bool(devices), "devices": devices}
