"""Time and memory of every method on GPU: RevNet18 and RevNet50 at the paper's width.

    python benchmarks/bench_gpu.py                           # writes results/gpu/<GPU>.json and prints it
    python benchmarks/bench_gpu.py --device cpu --quick      # a smoke run of the script on CPU (tests)

For each model (RevNet18, RevNet50; width 64) and stem (CIFAR 32x32, ImageNet 224x224), batch 64,
and each method, on one GPU with every stage on it:

* s/batch and images/s in the pipeline's steady state (a pipelined tick does the whole work of
  one minibatch: one forward and one backward per stage);
* ``torch.cuda.max_memory_allocated`` per stage: the device's peak while that stage runs its
  tick, and the bytes the stage holds between ticks (weights, gradients, momentum and what its
  method keeps); the device peak of the whole method;
* the PETRA/backprop step ratio (Table 1: 4/3 ideal on one device).

With 2 or more GPUs, also the pipeline spread over them (stages in contiguous blocks): its
images/s against one GPU's backprop, next to the ideal 3G/4 (Table 1, G devices).
Timings use CUDA events around the timed ticks; cuDNN picks its fastest algorithms (benchmark
mode; TF32 off, fp32 as the paper). Numbers go to JSON beside the GPU's name.
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import time
from pathlib import Path

import torch

from petra_core import METHODS, Pipeline, Recipe, build_model
from petra_core.engine import LocalWorld, assemble

CONFIGS = [("revnet18", "cifar", 32, 10), ("revnet18", "imagenet", 224, 1000),
           ("revnet50", "cifar", 32, 10), ("revnet50", "imagenet", 224, 1000)]


def sync(devices):
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


def measure(arch, stem, size, classes, method, *, devices, width, batch, timed):
    """Steady-state seconds per minibatch and memory of one method (all stages on ``devices``)."""
    torch.manual_seed(0)
    model = build_model(arch, num_classes=classes, stem=stem, width=width)
    x = torch.randn(batch, 3, size, size)
    y = torch.randint(0, classes, (batch,))
    if devices[0].type == "cuda":
        x, y = x.pin_memory(), y.pin_memory()
    J = len(model)
    per = 1 if METHODS[method].schedule == "pipelined" else 2 * J - 1
    fill = 2 * (J - 1) + 1 if per == 1 else 1
    n = fill + timed + 2 * J  # minibatches: enough that the timed ticks are all steady
    pipe = Pipeline(**assemble(model, method, LocalWorld(devices=devices), num_batches=n,
                               get_batch=lambda mb: (x, y), batch_size=batch, recipe=Recipe(base_lr=0.01)))
    cuda = devices[0].type == "cuda"
    peaks = [0] * J
    if cuda and len(devices) == 1:  # per-stage peaks: wrap each worker's tick halves
        for w in pipe.workers:
            for phase in ("forward", "backward"):
                inner = getattr(w, phase)

                def timed_phase(*args, w=w, inner=inner):
                    torch.cuda.reset_peak_memory_stats(devices[0])
                    out = inner(*args)
                    peaks[w.index] = max(peaks[w.index], torch.cuda.max_memory_allocated(devices[0]))
                    return out

                setattr(w, phase, timed_phase)
    pipe.run(fill * per)
    sync(devices)
    if cuda:
        for d in devices:
            torch.cuda.reset_peak_memory_stats(d)
    start = time.perf_counter()
    pipe.run(timed * per)
    sync(devices)
    seconds = (time.perf_counter() - start) / timed
    held = []
    for w in pipe.workers:
        weights = sum(p.numel() * p.element_size() * 3 for p in w.params)  # weights, gradients, momentum
        held.append(weights + sum(w.storage.kept_bytes().values()))
    device_peak = [torch.cuda.max_memory_allocated(d) for d in devices] if cuda else None
    return {"arch": arch, "stem": stem, "image_size": size, "method": method, "devices": len(devices),
            "stages": J, "s_per_batch": seconds, "images_per_s": batch / seconds,
            "stage_peak_bytes": peaks if cuda and len(devices) == 1 else None, "stage_held_bytes": held,
            "device_peak_bytes": device_peak}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--timed", type=int, default=6, help="timed minibatches per method")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--configs", default="all", help="'all' or e.g. revnet18:cifar,revnet50:imagenet")
    p.add_argument("--quick", action="store_true", help="tiny shapes (a smoke run of the script)")
    p.add_argument("--out", default="results/gpu", help="directory for the JSON")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_gpu: no CUDA device visible (use --device cpu --quick to smoke-test the script)")
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    configs = CONFIGS if args.configs == "all" else [c for c in CONFIGS if f"{c[0]}:{c[1]}" in args.configs.split(",")]
    if args.quick:
        configs, args.width, args.batch, args.timed = [("revnet18", "cifar", 16, 10)], 4, 4, 2
    gpus = [torch.device("cuda", i) for i in range(torch.cuda.device_count())] if args.device == "cuda" else []
    one = [gpus[0]] if gpus else [torch.device("cpu")]
    name = torch.cuda.get_device_name(0) if gpus else platform.processor() or platform.machine()
    rows = []
    for arch, stem, size, classes in configs:
        for method in args.methods.split(","):
            t0 = time.perf_counter()
            row = measure(arch, stem, size, classes, method, devices=one, width=args.width, batch=args.batch,
                          timed=args.timed)
            rows.append(row)
            print(f"{arch:9s} {stem:8s} {method:12s} {row['s_per_batch'] * 1e3:8.1f} ms/batch "
                  f"{row['images_per_s']:8.0f} img/s  peak {max(row['device_peak_bytes'] or [0]) / 2**30:6.2f} GiB "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        if len(gpus) >= 2:
            row = measure(arch, stem, size, classes, "petra", devices=gpus, width=args.width, batch=args.batch,
                          timed=args.timed)
            rows.append(row)
    out = {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda, "gpus": len(gpus),
           "width": args.width, "batch": args.batch, "rows": rows, "ratios": []}
    for arch, stem, *_ in configs:
        same = {r["method"]: r for r in rows if (r["arch"], r["stem"]) == (arch, stem) and r["devices"] == 1}
        ratio = {"arch": arch, "stem": stem}
        if "petra" in same and "backprop" in same:
            ratio["petra_over_backprop_step"] = same["petra"]["s_per_batch"] / same["backprop"]["s_per_batch"]
        if "petra" in same and "delayed" in same and same["petra"]["device_peak_bytes"]:
            ratio["petra_over_delayed_peak_memory"] = (max(same["petra"]["device_peak_bytes"])
                                                       / max(same["delayed"]["device_peak_bytes"]))
        spread = [r for r in rows if (r["arch"], r["stem"]) == (arch, stem) and r["devices"] > 1]
        if spread and "backprop" in same:
            ratio["multi_gpu_speedup_over_one_gpu_backprop"] = spread[0]["images_per_s"] / same["backprop"]["images_per_s"]
            ratio["ideal_3G_over_4"] = 3 * spread[0]["devices"] / 4
        out["ratios"].append(ratio)
    print(json.dumps(out["ratios"], indent=1))
    path = Path(args.out) / f"{re.sub(r'[^A-Za-z0-9]+', '-', name).strip('-').lower() or 'device'}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
    return out


if __name__ == "__main__":
    main()
