"""Where the host waits on the GPU in a pipelined tick, and how petra's backprop and PETRA compare
with a plain PyTorch loop over the same model on the GPU.

    python benchmarks/probes/gpu_probe.py --out plain_and_syncs.json     # from the project root, on a GPU
    python benchmarks/probes/gpu_probe.py --device cpu --quick           # a smoke run on CPU

What it measured (results/gpu/nvidia-h200/plain_and_syncs.json): ``sync_METHOD``, the synchronising
CUDA calls per steady tick of RevNet18 (width 64, batch 64) under
``torch.cuda.set_sync_debug_mode("warn")``, by where they were made, for PETRA, backprop and
delayed; ``plain_vs_engine``, per model (RevNet18, ResNet18), batch (64, 256) and setting
(training, bf16), the seconds per step of a plain PyTorch loop over the same model (channels-last,
one SGD optimizer, the same precision settings) beside ``bench_gpu.measure``'s seconds per
minibatch for backprop and PETRA, and their ratios.
"""

import argparse
import collections
import json
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for bench_gpu
from bench_gpu import apply_settings, measure  # noqa: E402

from petra_core import Pipeline, Recipe, build_model  # noqa: E402
from petra_core.engine import LocalWorld, PipelineSpec  # noqa: E402


def sync_points(method, device, width, batch, ticks=6):
    """Each synchronizing CUDA call during ``ticks`` steady ticks, by the innermost petra frame."""
    torch.manual_seed(0)
    model = build_model("revnet18", num_classes=10, stem="cifar", width=width)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    if device.type == "cuda":
        x, y = x.pin_memory(), y.pin_memory()
    J = len(model)
    pipe = Pipeline.build(
        PipelineSpec(
            model=model,
            method=method,
            world=LocalWorld(devices=[device] if device.type == "cuda" else None),
            num_batches=4 * J + ticks + 10,
            get_batch=lambda mb: (x, y),
            batch_size=batch,
            recipe=Recipe(base_lr=0.01),
        )
    )
    pipe.run(2 * J + 2)
    where = collections.Counter()
    if device.type != "cuda":
        return {}
    torch.cuda.synchronize()
    # second pass with stack capture through a custom showwarning
    records = []

    def hook(message, category, filename, lineno, file=None, line=None):
        st = traceback.extract_stack()[:-1]
        frames = [f"{Path(f.filename).name}:{f.lineno}:{f.name}" for f in st if "petra_core" in f.filename]
        records.append(" <- ".join(reversed(frames[-4:])) if frames else f"{filename}:{lineno}")

    old = warnings.showwarning
    warnings.showwarning = hook
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    try:
        for _ in range(ticks):
            pipe.advance()
    finally:
        torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = old
    for r in records:
        where[r] += 1
    return {
        "ticks": ticks,
        "syncs_per_tick": len(records) / ticks,
        "where": {k: v / ticks for k, v in where.most_common(25)},
    }


def plain_step_time(arch, device, width, batch, setting, steps):
    torch.manual_seed(0)
    precision = apply_settings(setting)
    model = build_model(arch, num_classes=10, stem="cifar", width=width).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    if device.type == "cuda":
        x = x.contiguous(memory_format=torch.channels_last)
    ctx = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if precision == "bf16"
        else torch.autocast(device.type, enabled=False)
    )

    def step():
        with ctx:
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="probe.json")
    a = p.parse_args()
    device = torch.device(a.device)
    width = 8 if a.quick else 64
    out = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu", "torch": torch.__version__}
    t0 = time.time()
    for method in ("petra", "backprop", "delayed"):
        try:
            out[f"sync_{method}"] = sync_points(method, device, width, 64, ticks=3 if a.quick else 6)
        except Exception as e:  # noqa: BLE001
            out[f"sync_{method}"] = {"error": repr(e)}
        print(method, json.dumps(out[f"sync_{method}"], indent=1)[:3000], flush=True)
    rows = []
    for batch in (16,) if a.quick else (64, 256):
        for setting in ("training",) if a.quick else ("training", "bf16"):
            for arch in ("revnet18", "resnet18"):
                try:
                    plain = plain_step_time(arch, device, width, batch, setting, 5 if a.quick else 20)
                    row = {"arch": arch, "batch": batch, "settings": setting, "plain_s": plain}
                    for method in ("backprop", "petra") if arch == "revnet18" else ("backprop",):
                        precision = apply_settings(setting)
                        m = measure(
                            arch,
                            "cifar",
                            32,
                            10,
                            method,
                            device=device,
                            width=width,
                            batch=batch,
                            timed=3 if a.quick else 10,
                            precision=precision,
                        )
                        row[f"{method}_s"] = m["s_per_batch"]
                        row[f"{method}_host_s_per_tick"] = m["host_s_per_tick"]
                        row[f"{method}_over_plain"] = m["s_per_batch"] / plain
                except Exception as e:  # noqa: BLE001
                    row = {"arch": arch, "batch": batch, "settings": setting, "error": repr(e)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    out["plain_vs_engine"] = rows
    out["seconds"] = time.time() - t0
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", a.out, f"{out['seconds']:.0f} s")


if __name__ == "__main__":
    main()
