"""Measured Tables 1 and 3 (and a gradient-fidelity sample), written as result files that the
report reads (``results/costs/``, ``runio.COST_FILES``).

These numbers do not depend on a training profile: Table 1 runs every method for a few
minibatches on one model at given shapes (:func:`~petra_core.accounting.per_stage`), Table 3 is
shape accounting of RevNet50 at the paper's setting, and the fidelity sample tracks delayed
gradients against true ones on a small RevNet for the figure when no run logged
``fidelity.csv``. ``petra costs`` and ``benchmarks/bench_accounting.py`` call :func:`measure`;
the pipeline runs it once (a few seconds to a minute) and the CSVs are committed.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import pandas as pd
import torch

from ..run import runio
from ..run.runio import COST_FILES, cpu_model

DEFAULTS = {
    "table1": {
        "arch": "revnet18",
        "stem": "imagenet",
        "image_size": 224,
        "width": 64,
        "batch": 2,
        # FLOPs are counted on minibatch 0, times are medians over minibatches 12-23, after the
        # pipeline filled (table1.steady_phases); with 3 minibatches, all during the fill, the
        # time column moved by up to 2x between two runs on one machine
        "num_batches": 24,
        "num_classes": 1000,
        "k": 1,
    },
    "fidelity": {
        "arch": "revnet18",
        "width": 8,
        "image_size": 16,
        "batch": 8,
        "k": 2,
        "num_batches": 80,
        "every": 8,
        "lr": 0.005,
        "methods": ["delayed", "dsp", "petra"],
    },
    "threads": 1,
}


def fidelity_sample(
    arch: str,
    width: int,
    image_size: int,
    batch: int,
    k: int,
    num_batches: int,
    every: int,
    lr: float,
    methods: list[str],
) -> pd.DataFrame:
    """Cosine and relative error of each delayed gradient vs the true one, random data, fixed seed."""
    from ..engine import Simulator
    from ..engine.fidelity import track_fidelity
    from ..families import build_model
    from ..optim import Recipe

    g = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(batch, 3, image_size, image_size, generator=g), torch.randint(0, 10, (batch,), generator=g))
        for _ in range(num_batches)
    ]
    frames = []
    for method in methods:
        torch.manual_seed(0)
        model = build_model(arch, num_classes=10, width=width)
        sim = Simulator(
            model,
            method,
            num_batches=num_batches,
            get_batch=batches.__getitem__,
            batch_size=batch,
            k=k,
            recipe=Recipe(base_lr=lr, scale_lr=False, weight_decay=5e-4),
        )
        tracker = track_fidelity(sim, every=every)
        sim.run()
        frames.append(tracker.frame())
    return pd.concat(frames, ignore_index=True)


def measure(settings: dict | None = None) -> dict:
    """Every cost table as a DataFrame, plus a JSON-able record of the settings and the machine."""
    from ..families import build_model
    from . import network_costs, per_stage, table1, table3  # the functions (the package exports them lazily)

    given = settings or {}
    settings = {
        "threads": given.get("threads", DEFAULTS["threads"]),
        **{key: {**DEFAULTS[key], **given.get(key, {})} for key in ("table1", "fidelity")},
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(settings["threads"])
    try:
        start = time.perf_counter()
        stages = per_stage(settings["table1"]["arch"], **{k: v for k, v in settings["table1"].items() if k != "arch"})
        t1_seconds = time.perf_counter() - start
        frames = {
            "table1_per_stage": stages,
            "table1": pd.DataFrame(table1(stages)),
            "network_costs": network_costs(stages),
            "table3": pd.DataFrame(table3()),
            "fidelity": fidelity_sample(**settings["fidelity"]),
        }
    finally:
        torch.set_num_threads(threads)
    t3 = frames["table3"].iloc[0]
    with torch.device("meta"):
        params = sum(p.numel() for p in build_model(t3.arch, num_classes=1000, stem="imagenet", width=64).parameters())
    info = {
        "settings": settings,
        "table3_params": params,
        "table1_seconds": round(t1_seconds, 1),
        "machine": {
            "processor": cpu_model(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": settings["threads"],
        },
    }
    return {"frames": frames, "info": info}


def write(measured: dict, out_dir: str | Path) -> list[Path]:
    """The CSVs and ``costs.json`` of :func:`measure` (the names of ``runio.COST_FILES``)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in COST_FILES:
        path = out_dir / name
        if name.endswith(".csv"):
            runio.write_text(
                path, measured["frames"][name.removesuffix(".csv")].to_csv(index=False, float_format="%.6g")
            )
        else:
            runio.write_text(
                path, json.dumps(runio.finite_json(measured["info"]), indent=2, sort_keys=True, allow_nan=False) + "\n"
            )
        paths.append(path)
    return paths
