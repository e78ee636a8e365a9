"""The floor for a training step of petra's RevNet18 on one GPU, plain PyTorch: eager, one whole-step
CUDA graph, and torch.compile. The anchor that the engine's GPU ratios are measured against.

    python benchmarks/probes/gpu_limit.py --out plain_limit.json      # from the project root, on a GPU (CUDA only)

What it measured (results/gpu/nvidia-h200/plain_limit.json): seconds per training step of RevNet18
(width 64, bf16 autocast, channels-last, foreach SGD, cuDNN's default settings) at batch 64 and
256: eager (``eager_s``), the whole step captured once and replayed as one CUDA graph
(``graph_s``), and ``torch.compile`` per mode (``compile_MODE_s``; its first call, compilation
included, ``compile_MODE_first_s``).
"""

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from petra_core import build_model


def timeit(step, n=30, warm=5):
    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def setup(arch, batch, width):
    torch.manual_seed(0)
    model = build_model(arch, num_classes=10, stem="cifar", width=width).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4, foreach=True)
    x = torch.randn(batch, 3, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device="cuda")
    return model, opt, x, y


def eager(arch, batch, width):
    model, opt, x, y = setup(arch, batch, width)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    return timeit(step)


def graphed(arch, batch, width):
    model, opt, x, y = setup(arch, batch, width)

    def body():
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            body()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    return timeit(g.replay)


def compiled(arch, batch, width, mode):
    model, opt, x, y = setup(arch, batch, width)
    cmodel = torch.compile(model, mode=mode)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(cmodel(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    return timeit(step), first


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="limit.json")
    p.add_argument("--compile", default="default", help="comma list of torch.compile modes, or ''")
    a = p.parse_args()
    rows = []
    for batch in (64, 256):
        row = {"arch": "revnet18", "width": 64, "batch": batch, "precision": "bf16"}
        for name, fn in (("eager_s", eager), ("graph_s", graphed)):
            try:
                row[name] = fn("revnet18", batch, 64)
            except Exception as e:  # noqa: BLE001
                row[name] = repr(e)[:300]
            print(json.dumps(row), flush=True)
        for mode in [m for m in a.compile.split(",") if m]:
            try:
                row[f"compile_{mode}_s"], row[f"compile_{mode}_first_s"] = compiled("revnet18", batch, 64, mode)
            except Exception as e:  # noqa: BLE001
                row[f"compile_{mode}_s"] = repr(e)[:300]
            print(json.dumps(row), flush=True)
        rows.append(row)
    Path(a.out).write_text(
        json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}, indent=1) + "\n"
    )


if __name__ == "__main__":
    main()
