"""Measured Tables 1 and 3 (and a gradient-fidelity sample), cached as CSV under ``results/costs/``.

These numbers do not depend on a training profile: Table 1 runs every method for a few
minibatches on one model at given shapes (``petra_core.accounting.per_stage``), Table 3 is shape
accounting of RevNet50 at the paper's setting, and the fidelity sample tracks delayed gradients
against true ones on a small RevNet for the figure when no run logged ``fidelity.csv``. The
pipeline computes them once (a few seconds to a minute) and the CSVs are committed.
"""
from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import pandas as pd
import torch

DEFAULTS = {
    "table1": {"arch": "revnet18", "stem": "imagenet", "image_size": 224, "width": 64, "batch": 2,
               "num_batches": 3, "num_classes": 1000, "k": 1},
    "fidelity": {"arch": "revnet18", "width": 8, "image_size": 16, "batch": 8, "k": 2, "num_batches": 80,
                 "every": 8, "lr": 0.005, "methods": ["delayed", "dsp", "petra"]},
    "threads": 1,
}


def cpu_model() -> str:
    """The CPU's model name where the OS says it (Linux), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fidelity_sample(arch: str, width: int, image_size: int, batch: int, k: int, num_batches: int, every: int,
                    lr: float, methods: list[str]) -> pd.DataFrame:
    """Cosine and relative error of each delayed gradient vs the true one, random data, fixed seed."""
    from .. import Recipe, Simulator, build_model
    from ..accounting import track_fidelity

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(batch, 3, image_size, image_size, generator=g), torch.randint(0, 10, (batch,), generator=g))
               for _ in range(num_batches)]
    frames = []
    for method in methods:
        torch.manual_seed(0)
        model = build_model(arch, num_classes=10, width=width)
        sim = Simulator(model, method, num_batches=num_batches, get_batch=batches.__getitem__, batch_size=batch, k=k,
                        recipe=Recipe(base_lr=lr, scale_lr=False, weight_decay=5e-4))
        tracker = track_fidelity(sim, every=every)
        sim.run()
        frames.append(tracker.frame())
    return pd.concat(frames, ignore_index=True)


def measure(settings: dict | None = None) -> dict:
    """Every cost table as a DataFrame, plus a JSON-able record of the settings and the machine."""
    from ..accounting import network_costs, per_stage, table1, table3
    from .results import model_facts

    given = settings or {}
    settings = {"threads": given.get("threads", DEFAULTS["threads"]),
                **{key: {**DEFAULTS[key], **given.get(key, {})} for key in ("table1", "fidelity")}}
    threads = torch.get_num_threads()
    torch.set_num_threads(settings["threads"])
    try:
        start = time.perf_counter()
        stages = per_stage(settings["table1"]["arch"], **{k: v for k, v in settings["table1"].items() if k != "arch"})
        t1_seconds = time.perf_counter() - start
        frames = {"table1_per_stage": stages, "table1": pd.DataFrame(table1(stages)),
                  "network_costs": network_costs(stages), "table3": pd.DataFrame(table3()),
                  "fidelity": fidelity_sample(**settings["fidelity"])}
    finally:
        torch.set_num_threads(threads)
    t3 = frames["table3"].iloc[0]
    params, _ = model_facts(t3.arch, 1000, "imagenet", 64)
    info = {"settings": settings, "table3_params": params, "table1_seconds": round(t1_seconds, 1),
            "machine": {"processor": cpu_model(), "platform": platform.platform(),
                        "torch": torch.__version__, "threads": settings["threads"]}}
    return {"frames": frames, "info": info}


def write(measured: dict, out_dir: str | Path) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, frame in measured["frames"].items():
        path = out_dir / f"{name}.csv"
        frame.to_csv(path, index=False, float_format="%.6g")
        paths.append(path)
    path = out_dir / "costs.json"
    path.write_text(json.dumps(measured["info"], indent=2, sort_keys=True) + "\n")
    return [*paths, path]


def load(costs_dir: str | Path) -> dict:
    costs_dir = Path(costs_dir)
    out = {name: pd.read_csv(costs_dir / f"{name}.csv")
           for name in ("table1_per_stage", "table1", "network_costs", "table3", "fidelity")}
    out["info"] = json.loads((costs_dir / "costs.json").read_text())
    return out
