"""The planner against one GPU: each ``results/gpu/NAME/stage_profile.json`` row (training settings)
predicted on one device, all its stages there, beside the bench row of the same GPU, model and
method (``results/gpu/NAME.json``): time per minibatch and peak memory. Rendered into
docs/planning.md by ``petra readme``; nothing here is typed by hand."""

from __future__ import annotations

import json
from pathlib import Path

from . import labels

SETTINGS = "training"  # the bench rows' fp32 settings, which the stage profile also timed


def check_rows(gpu_root: str | Path) -> list[dict]:
    """One row per (GPU, model, method) that both the stage profile and the bench timed."""
    from ..plan.profiling import from_stage_profile
    from ..plan.simulate import predict

    out = []
    for profile_path in sorted(Path(gpu_root).glob("*/stage_profile.json")):
        bench_path = profile_path.parent.with_suffix(".json")
        if not bench_path.is_file():
            continue
        bench = {
            (r["arch"], r["method"]): r
            for r in json.loads(bench_path.read_text())["rows"]
            if r.get("settings") == SETTINGS and r.get("devices", 1) == 1 and r.get("phases", "eager") == "eager"
        }
        timed = json.loads(profile_path.read_text())["rows"]
        for arch, method in dict.fromkeys((r["arch"], r["method"]) for r in timed if r["settings"] == SETTINGS):
            measured = bench.get((arch, method))
            if not measured or not measured.get("s_per_batch"):
                continue
            profile = from_stage_profile(profile_path, arch=arch, method=method, settings=SETTINGS)
            pred = predict(profile, method, placement=[range(profile.num_stages)])
            peak = measured.get("device_peak_bytes")
            out.append(
                {
                    "gpu": profile_path.parent.name,
                    "model": labels.model_label(arch),
                    "method": labels.METHOD_LABELS.get(method, method),
                    "batch": profile.batch,
                    "predicted_ms": 1e3 * pred.seconds_per_minibatch,
                    "bench_ms": 1e3 * measured["s_per_batch"],
                    "error": pred.seconds_per_minibatch / measured["s_per_batch"] - 1,
                    "predicted_peak_gib": pred.peak_bytes[0] / 2**30,
                    "measured_peak_gib": peak / 2**30 if peak else None,
                    "peak_error": pred.peak_bytes[0] / peak - 1 if peak else None,
                }
            )
    return out
