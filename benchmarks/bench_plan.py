"""The planner's speed: a full search for RevNet50 over 1-64 devices (target: under 10 s on one core).

    taskset -c 0 python benchmarks/bench_plan.py            # from the project root
    python benchmarks/bench_plan.py --max-devices 16

For each of backprop, DSP and PETRA, from the first H200's RevNet50 stage profile
(results/gpu/nvidia-h200/stage_profile.json, training settings): the best configuration and its
predicted time for every device count 1..N on 8x1-100gbe nodes (the event simulation of each), the
fewest 80 GB devices that hold the model, then the largest RevNet per method on an 8-GPU H100 node
(meta-device sizing). Prints the wall seconds of each part and the total, and the CPU seconds of the
total (this process's: on a shared machine the wall time grows with the load, printed too); torch
is imported (and timed) apart, before the clock starts.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "results/gpu/nvidia-h200/stage_profile.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-devices", type=int, default=64)
    args = parser.parse_args()
    t = time.perf_counter()
    import torch

    from petra_core.methods import METHODS  # noqa: F401  (the registry, imported once)

    print(f"import torch and the method registry: {time.perf_counter() - t:.2f} s (not counted)")
    torch.set_num_threads(1)
    from petra_core.plan.cluster import load_cluster
    from petra_core.plan.profiling import from_stage_profile
    from petra_core.plan.search import largest_revnet, min_devices, scan_devices

    total, cpu = time.perf_counter(), time.process_time()
    nodes, h100 = load_cluster("8x1-100gbe"), load_cluster("h100-sxm-node")
    for method in ("backprop", "dsp", "petra"):
        t = time.perf_counter()
        profile = from_stage_profile(PROFILE, arch="revnet50", method=method)
        scan = scan_devices(profile, method, args.max_devices, cluster=nodes)
        fewest = min_devices(profile, method, h100.memory_bytes)
        best = min(scan, key=lambda pr: pr.seconds_per_minibatch / pr.replicas)
        print(
            f"{method:<9} scan 1-{args.max_devices} devices: {time.perf_counter() - t:.2f} s; best "
            f"{best.devices} devices ({best.replicas} replicas, split {best.split}) "
            f"{1e3 * best.seconds_per_minibatch:.1f} ms/minibatch; fewest 80 GB devices: "
            f"{fewest[0] if fewest else 'none'}"
        )
    t = time.perf_counter()
    for method in ("backprop", "delayed", "dsp", "petra"):
        big = largest_revnet(h100, method, batch=64, stem="imagenet")
        print(
            f"largest RevNet, {method:<9} on h100-sxm-node: {big['arch'] if big else '-'} width {big and big['width']}"
        )
    print(f"largest RevNet per method: {time.perf_counter() - t:.2f} s")
    print(
        f"total: {time.perf_counter() - total:.2f} s wall, {time.process_time() - cpu:.2f} s CPU; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
