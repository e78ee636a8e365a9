"""Where the host spends a pipelined tick (cProfile over 20 steady ticks), PETRA and backprop.

    python benchmarks/probes/gpu_hostprof.py cuda 64 > host_profile.txt   # from the project root: device, width
    python benchmarks/probes/gpu_hostprof.py cpu 8                         # a smoke run on CPU

What it measured (results/gpu/nvidia-h200/host_profile.txt): RevNet18 CIFAR, width 64, batch 64,
after 3J ticks: the host's time per tick over 20 ticks under cProfile, and the profile's 30 most
expensive functions by own time and 45 by cumulative time, for PETRA and backprop.
"""

import cProfile
import io
import pstats
import sys
import time

import torch

from petra_core import Pipeline, Recipe, build_model
from petra_core.engine import LocalWorld, PipelineSpec


def profile_ticks(method: str, dev: torch.device, width: int) -> None:
    """Print the host's time per tick over 20 steady ticks of ``method`` and their cProfile."""
    torch.manual_seed(0)
    model = build_model("revnet18", num_classes=10, stem="cifar", width=width)
    x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))
    J = len(model)
    pipe = Pipeline.build(
        PipelineSpec(
            model=model,
            method=method,
            world=LocalWorld(devices=[dev] if dev.type == "cuda" else None),
            num_batches=200,
            get_batch=lambda mb: (x, y),
            batch_size=64,
            recipe=Recipe(base_lr=0.01),
        )
    )
    pipe.run(3 * J)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(20):
        pipe.advance()
    prof.disable()
    host = (time.perf_counter() - t0) / 20
    if dev.type == "cuda":
        torch.cuda.synchronize()
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    st.sort_stats("tottime").print_stats(30)
    st.sort_stats("cumtime").print_stats(45)
    print(f"=== {method}: host {host * 1e3:.2f} ms per tick (profiled)")
    print(s.getvalue())


def main() -> None:
    dev = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
    width = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    for method in ("petra", "backprop"):
        profile_ticks(method, dev, width)


if __name__ == "__main__":
    main()
