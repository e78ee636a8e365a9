"""Data parallelism on the mesh: images/s of R replicas (one process each) against one process.

R = 2 processes of one thread each (gloo; a mesh of 2 replicas × 1 pipeline position, every
stage of a replica in its process, the ``dp`` rule: one flat gradient all-reduce per stage and
step, launched for every stage before the first is waited on) against one process training the
same model with 1 thread and with 2 threads. RevNet18, CIFAR stem, random 32×32 data, batch 64
per replica (the single process trains batch 64 too: images/s is the measure). Throughputs
exclude the first ``--warmup`` minibatches.

Goal (issue "The mesh"): ≥ 1.8× the 1-thread process and ≥ 1.0× the 2-thread one.

    python benchmarks/bench_dp.py                       # ~2-4 min on 2 idle CPU cores
    python benchmarks/bench_dp.py --method petra        # any method: the same pipeline, replicated
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bench_distributed import single_process  # noqa: E402
from harness.ranks import RANKS  # noqa: E402

from petra_core.engine.launch import launch_local  # noqa: E402


def replicated(argv: list[str], method: str, replicas: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "dp.json")
        procs = launch_local(
            [*argv, "--method", method, "--replicas", str(replicas), "--threads", "1", "--json", out],
            replicas,
            timeout=900,
            capture=True,
            script=RANKS,
        )
        for r, p in enumerate(procs):
            if p.returncode != 0:
                raise SystemExit(f"rank {r} exited {p.returncode}:\n{p.err[-2000:]}")
        return json.loads(Path(out).read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", default="backprop")
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--batch", type=int, default=64, help="per replica")
    p.add_argument("--steps", type=int, default=12, help="minibatches per replica")
    p.add_argument("--warmup", type=int, default=2, help="minibatches excluded from the throughput")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument(
        "--record",
        action="store_true",
        help="also write results/benchmarks/bench_dp-VARIANT.json (README's block is rendered from it)",
    )
    args = p.parse_args()
    recorder = None
    if args.record:
        from petra_core.report.benchmarks import Recorder

        recorder = Recorder("bench_dp", f"{args.method}-w{args.width}-r{args.replicas}")
    argv = [
        "--arch",
        "revnet18",
        "--width",
        str(args.width),
        "--batch",
        str(args.batch),
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
    ]
    dp = replicated(argv, args.method, args.replicas)
    dp_rate = dp.get("steady_images_per_s", dp["images_per_s"])
    one = single_process(argv, 1, "cpu", args.warmup, args.method)
    two = single_process(argv, 2, "cpu", args.warmup, args.method)
    print(
        f"RevNet18 width {args.width}, {args.method}, batch {args.batch} per replica, {args.steps} minibatches "
        f"per replica ({args.warmup} warm-up excluded)"
    )
    print(f"  {args.replicas} replicas x 1 thread (gloo, dp): {dp_rate:8.1f} images/s")
    print(f"  1 process, 1 thread:                {one:8.1f} images/s")
    print(f"  1 process, 2 threads:               {two:8.1f} images/s")
    print(
        f"  ratios: dp / 1 thread = {dp_rate / one:.2f} (goal >= 1.8), dp / 2 threads = {dp_rate / two:.2f} "
        f"(goal >= 1.0)"
    )
    if recorder is not None:
        print(
            "recorded: "
            + str(
                recorder.write(
                    {
                        "method": args.method,
                        "width": args.width,
                        "batch": args.batch,
                        "replicas": args.replicas,
                        "dp_images_per_s": dp_rate,
                        "one_thread_images_per_s": one,
                        "two_threads_images_per_s": two,
                        "vs_one_thread": dp_rate / one,
                        "vs_two_threads": dp_rate / two,
                    }
                )
            )
        )
    for rank in dp["ranks"]:
        print(
            f"  rank {rank['rank']} (replica {rank['replica']}): compute {rank['compute_s']:.2f} s of "
            f"{rank['wall_s']:.2f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
