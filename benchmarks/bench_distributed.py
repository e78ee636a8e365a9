"""Throughput of the distributed pipeline: PETRA and backprop on N ranks vs one process.

CPU (default): N = 2 processes with one thread each (gloo) against single-process backprop with
2 threads (and with 1 thread, for reference), RevNet18 with the CIFAR stem on random 32x32
data. GPU (``--device cuda``): one rank per GPU (NCCL) against single-GPU backprop.

Printed: images/s of each run, the ratios to the single-process baselines, the ideal speed-up
from the paper's Table 1, and per rank the time spent computing, blocked waiting for a message,
and sending. Throughputs are measured where the pipeline is full (PETRA: ticks 2(J-1)..n-1;
backprop: after ``--warmup`` minibatches), so fill and drain are excluded.

Table 1 in one line: backprop costs 3J units per minibatch on one device (forward 1, backward
2 per stage); PETRA costs 4J (one more forward to rebuild the input) spread over the devices,
so with D ranks the ideal speed-up over one device is 3D/4 (the paper's 3J/4 with one stage per
device). Backprop in a pipeline is the sequential schedule: one rank works at a time, so its
ideal is 1 (minus communication); the gap between PETRA and backprop on the same ranks is the
pipeline bubble that PETRA removes.

    python benchmarks/bench_distributed.py                 # ~1-3 min on 2 idle CPU cores
    python benchmarks/bench_distributed.py --device cuda   # one rank per GPU
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from petra_core import Simulator  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness.ranks import RANKS, demo_setup  # noqa: E402
from harness.ranks import parser as demo_parser

from petra_core.engine.host_memory import retain_freed_memory  # noqa: E402
from petra_core.engine.launch import launch_local  # noqa: E402


def single_process(argv: list[str], threads: int | None, device: str, warmup: int, method: str = "backprop") -> float:
    """Images/s of ``method`` (default: plain backprop, the simulator's sequential schedule), all
    stages in this process, after ``warmup`` minibatches' worth of ticks (for a pipelined method the
    final drain is inside the timed window)."""
    args = demo_parser().parse_args(argv)
    if threads:
        torch.set_num_threads(threads)
    retain_freed_memory()  # as a run and the ranks do (host_memory.py)
    model, get_batch, recipe = demo_setup(args)
    model.to(device)

    def batch(mb):
        x, y = get_batch(mb)
        return x.to(device), y.to(device)

    sim = Simulator(model, method, num_batches=args.steps, get_batch=batch, batch_size=args.batch, recipe=recipe)
    sim.run(warmup * sim.schedule.period)
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    sim.run()
    if device == "cuda":
        torch.cuda.synchronize()
    return (args.steps - warmup) * args.batch / (time.perf_counter() - t0)


def distributed(argv: list[str], nprocs: int, method: str, workdir: str) -> dict:
    out = os.path.join(workdir, f"{method}.json")
    procs = launch_local([*argv, "--method", method, "--json", out], nprocs, timeout=600, capture=True, script=RANKS)
    for r, p in enumerate(procs):
        if p.returncode != 0:
            raise SystemExit(f"{method}: rank {r} exited {p.returncode}\n{p.err[-4000:]}")
    with open(out) as f:
        return json.load(f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--nprocs", type=int, default=None, help="ranks (default: 2 on CPU, one per GPU)")
    p.add_argument("--width", type=int, default=None, help="base width (default 32 on CPU, 64 on GPU)")
    p.add_argument("--batch", type=int, default=None, help="minibatch (default 32 on CPU, 128 on GPU)")
    p.add_argument("--petra-steps", type=int, default=40, help="minibatches of the PETRA run (> 2(J-1) = 18)")
    p.add_argument("--backprop-steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2, help="backprop minibatches excluded from the timing")
    p.add_argument("--placement", default="balanced")
    p.add_argument(
        "--record",
        action="store_true",
        help="also write results/benchmarks/bench_distributed-VARIANT.json (README's block is rendered from it)",
    )
    a = p.parse_args()
    gpu = a.device == "cuda"
    if gpu and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no GPU visible")
    nprocs = a.nprocs or (torch.cuda.device_count() if gpu else 2)
    width, batch = a.width or (64 if gpu else 32), a.batch or (128 if gpu else 32)
    base = [
        "--arch",
        "revnet18",
        "--stem",
        "cifar",
        "--image-size",
        "32",
        "--num-classes",
        "10",
        "--width",
        str(width),
        "--batch",
        str(batch),
        "--device",
        a.device,
        "--placement",
        a.placement,
        "--warmup",
        str(a.warmup),
    ]
    cpu_threads = [] if gpu else ["--threads", "1"]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"RevNet18 (CIFAR stem) width {width}, batch {batch}, 32x32 random data; {nprocs} ranks on "
        f"{a.device}{' (1 thread each, gloo)' if not gpu else ' (NCCL)'}; load average {load:.2f} on "
        f"{os.cpu_count()} CPUs",
        flush=True,
    )

    recorder = None
    if a.record:
        from petra_core.report.benchmarks import Recorder

        recorder = Recorder("bench_distributed", f"{a.device}-w{width}-n{nprocs}")
    t_start = time.time()
    bp_argv = [*base, "--steps", str(a.backprop_steps)]
    baselines = {}
    if gpu:
        baselines["1 GPU"] = single_process(bp_argv, None, "cuda", a.warmup)
    else:
        baselines["1 process, 2 threads"] = single_process(bp_argv, 2, "cpu", a.warmup)
        baselines["1 process, 1 thread"] = single_process(bp_argv, 1, "cpu", a.warmup)
    with tempfile.TemporaryDirectory() as tmp:
        runs = {
            "petra": distributed([*base, *cpu_threads, "--steps", str(a.petra_steps)], nprocs, "petra", tmp),
            "backprop": distributed([*base, *cpu_threads, "--steps", str(a.backprop_steps)], nprocs, "backprop", tmp),
        }
    ref_name = next(iter(baselines))
    ref = baselines[ref_name]
    ideal = 3 * nprocs / 4
    print()
    print(f"{'run':44s} {'images/s':>9s} {'vs ' + ref_name:>26s} {'ideal (Table 1)':>16s}")
    for name, v in baselines.items():
        print(f"{'backprop, ' + name:44s} {v:9.1f} {v / ref:26.2f} {'':>16s}")
    for method, r in runs.items():
        v = r["steady_images_per_s"]
        ideal_s = f"{ideal:.2f} (3D/4)" if method == "petra" else "1.00 (bubble)"
        print(
            f"{method + f', {nprocs} ranks (placement ' + r['placement'] + ')':44s} {v:9.1f} {v / ref:26.2f} "
            f"{ideal_s:>16s}"
        )
    if len(baselines) > 1:
        one = baselines["1 process, 1 thread"]
        print(
            f"PETRA vs backprop on 1 process, 1 thread: {runs['petra']['steady_images_per_s'] / one:.2f} "
            f"(ideal {ideal:.2f}); 2 threads vs 1 thread: {ref / one:.2f}"
        )
    print(
        f"PETRA vs backprop on the same {nprocs} ranks: "
        f"{runs['petra']['steady_images_per_s'] / runs['backprop']['steady_images_per_s']:.2f} "
        f"(ideal {ideal:.2f} = 3D/4: PETRA keeps all ranks busy at 4/3 the FLOPs, backprop one at a time)"
    )
    for method, r in runs.items():
        print(
            f"\n{method}: {r['steady_window']}, whole run {r['images_per_s']:.1f} images/s in {r['wall_s']:.1f} s"
            + (
                f"; measured stage costs (ms): {', '.join(f'{c * 1e3:.0f}' for c in r['stage_costs'])}"
                if r.get("stage_costs")
                else ""
            )
        )
        print(
            f"  {'rank':4s} {'stages':12s} {'compute s':>9s} {'waiting s':>9s} {'send s':>7s} "
            f"{'bg recv s':>9s} {'sent MiB':>8s}"
        )
        for row in r["ranks"]:
            print(
                f"  {row['rank']:4d} {row['stages']:12s} {row['compute_s']:9.2f} {row['recv_wait_s']:9.2f} "
                f"{row['send_s']:7.2f} {row['background_recv_s']:9.2f} {row['bytes_sent'] / 2**20:8.1f}"
            )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\ntotal {time.time() - t_start:.0f} s; load average at the end {load:.2f}")
    if recorder is not None:
        result = {
            "width": width,
            "batch": batch,
            "ranks": nprocs,
            "device": a.device,
            "ideal_petra": ideal,
            "baselines_images_per_s": baselines,
            "runs": {
                m: {"images_per_s": r["steady_images_per_s"], "placement": r["placement"]} for m, r in runs.items()
            },
            "petra_vs_backprop_same_ranks": runs["petra"]["steady_images_per_s"]
            / runs["backprop"]["steady_images_per_s"],
            "petra_vs_baselines": {n: runs["petra"]["steady_images_per_s"] / v for n, v in baselines.items()},
        }
        print(f"recorded: {recorder.write(result)}")


if __name__ == "__main__":
    main()
