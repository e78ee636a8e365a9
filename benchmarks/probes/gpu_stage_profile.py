"""Per-stage, per-phase device time (the sum of the kernels each phase launched, from torch.profiler)
and host time of petra's pipeline on one GPU: the profile a cluster model starts from, and the
measure of how much of a tick the device is busy.

    python benchmarks/probes/gpu_stage_profile.py --out stage_profile.json    # from the project root, on a GPU
    python benchmarks/probes/gpu_stage_profile.py --device cpu --quick        # a smoke run on CPU

What it measured (results/gpu/nvidia-h200/stage_profile.json): for backprop, PETRA, DSP and
delayed (RevNet18 CIFAR; RevNet50 ImageNet without delayed), width 64, batch 64, training and
bf16 settings: wall and host time per minibatch of an unobserved run, then each stage's phases
(forward, rebuild, backward, send, step) with a synchronize before and after each: ``*_host_s``
is that synced time, an upper bound of the phase's device time. The kernel sums (``*_device_s``,
``device_busy_s_per_minibatch``) double-count (they exceed the wall time): do not use them.
"""

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from petra_core import METHODS, Pipeline, Recipe, build_model
from petra_core.engine import LocalWorld, PipelineSpec
from petra_core.engine.observers import Observer
from petra_core.precision import set_numerics

SETTINGS = {"training": ("fp32", True), "bf16": ("bf16", False)}


class Ranges(Observer):
    """A profiler range per (stage, phase); on a GPU each phase ends with a synchronize, so the kernels
    a phase launched run inside its range's window and can be attributed to it by time."""

    def __init__(self, cuda):
        self.cuda, self.open, self.host = cuda, {}, defaultdict(float)

    def before(self, phase, worker, mb):
        if self.cuda:
            torch.cuda.synchronize()
        name = f"s{worker.index}.{phase}"
        rf = record_function(name)
        rf.__enter__()
        self.open[name] = (rf, time.perf_counter())

    def after(self, phase, worker, mb):
        name = f"s{worker.index}.{phase}"
        rf, t0 = self.open.pop(name)
        if self.cuda:
            torch.cuda.synchronize()
        self.host[name] += time.perf_counter() - t0
        rf.__exit__(None, None, None)


def device_time(evs, ticks: int) -> tuple[dict, float, list, list]:
    """Each (stage, phase) range's kernel seconds per minibatch, the kernels' total per minibatch, the
    kernels and the ranges, from the profiler's events: a kernel counts in the range it started in."""
    windows = [
        (e.name, e.time_range.start, e.time_range.end)
        for e in evs
        if e.name.startswith("s") and "." in e.name and e.name.split(".")[0][1:].isdigit()
    ]
    kernels = [
        (e.time_range.start, e.time_range.end)
        for e in evs
        if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type)
    ]
    if not kernels:  # older layouts: kernels hang under CPU events without their own event
        kernels = [
            (k.start if hasattr(k, "start") else 0, (k.start if hasattr(k, "start") else 0) + k.duration)
            for e in evs
            for k in getattr(e, "kernels", [])
        ]
    kernels.sort()
    import bisect

    starts = [k[0] for k in kernels]
    dev = defaultdict(float)
    for name, a, b in windows:
        i = bisect.bisect_left(starts, a)
        while i < len(kernels) and kernels[i][0] < b:
            dev[name] += kernels[i][1] - kernels[i][0]
            i += 1
    busy = sum(b - a for a, b in kernels) / 1e6 / ticks
    dev = {k: v / 1e6 / ticks for k, v in dev.items()}
    return dev, busy, kernels, windows


def measure(arch, stem, size, classes, method, setting, device, width, batch, ticks):
    precision, deterministic = SETTINGS[setting]
    set_numerics(precision, deterministic)
    torch.manual_seed(0)
    model = build_model(arch, num_classes=classes, stem=stem, width=width)
    x, y = torch.randn(batch, 3, size, size), torch.randint(0, classes, (batch,))
    cuda = device.type == "cuda"
    if cuda:
        x, y = x.pin_memory(), y.pin_memory()
    J = len(model)
    per = 2 * J - 1 if METHODS[method].schedule.fixed_weights_in_flight else 1  # ticks per minibatch
    n = 2 * J + 2 * ticks + 10
    pipe = Pipeline.build(
        PipelineSpec(
            model=model,
            method=method,
            world=LocalWorld(devices=[device] if cuda else None),
            num_batches=n,
            get_batch=lambda mb: (x, y),
            batch_size=batch,
            recipe=Recipe(base_lr=0.01),
            precision=precision,
        )
    )
    pipe.run(2 * J + 1 if per == 1 else per)  # fill the pipeline, or one whole minibatch
    if cuda:
        torch.cuda.synchronize()
    # 1. unobserved: wall and host time per minibatch, as a run sees them
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    nt = ticks * per
    for _ in range(nt):
        pipe.advance()
    host_total = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    # 2. observed and profiled: every phase synchronised, kernels attributed to phases by time
    obs = Ranges(cuda)
    pipe.observers.append(obs)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(nt):
            pipe.advance()
        if cuda:
            torch.cuda.synchronize()
    pipe.observers.remove(obs)
    dev, busy, kernels, windows = device_time(prof.events(), ticks)
    stages = []
    for j in range(J):
        row = {"stage": j}
        for ph in ("forward", "rebuild", "backward", "send", "step"):
            k = f"s{j}.{ph}"
            if k in dev or k in obs.host:
                row[f"{ph}_device_s"] = dev.get(k, 0.0)
                row[f"{ph}_host_s"] = obs.host.get(k, 0.0) / ticks
        stages.append(row)
    return {
        "arch": arch,
        "stem": stem,
        "method": method,
        "settings": setting,
        "width": width,
        "batch": batch,
        "stages": J,
        "ticks_per_minibatch": per,
        "minibatches": ticks,
        "wall_s_per_minibatch": wall / ticks,
        "host_s_per_minibatch": host_total / ticks,
        "device_busy_s_per_minibatch": busy,
        "kernels_seen": len(kernels),
        "ranges_seen": len(windows),
        "per_stage": stages,
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="stage_profile.json")
    a = p.parse_args()
    device = torch.device(a.device)
    configs = [("revnet18", "cifar", 32, 10, 64), ("revnet50", "imagenet", 224, 1000, 64)]
    if a.quick:
        configs = [("revnet18", "cifar", 32, 10, 8)]
    rows = []
    for arch, stem, size, classes, width in configs:
        for setting in ("training",) if a.quick else ("training", "bf16"):
            for method in ("backprop", "petra", "dsp") + (("delayed",) if arch == "revnet18" else ()):
                try:
                    r = measure(
                        arch,
                        stem,
                        size,
                        classes,
                        method,
                        setting,
                        device,
                        width,
                        16 if a.quick else 64,
                        2 if a.quick else 6,
                    )
                except Exception as e:  # noqa: BLE001
                    r = {"arch": arch, "method": method, "settings": setting, "error": repr(e)[:300]}
                rows.append(r)
                print(json.dumps({k: v for k, v in r.items() if k != "per_stage"}), flush=True)
                Path(a.out).write_text(
                    json.dumps(
                        {
                            "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
                            "torch": torch.__version__,
                            "rows": rows,
                        },
                        indent=1,
                    )
                    + "\n"
                )
                if device.type == "cuda":
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
