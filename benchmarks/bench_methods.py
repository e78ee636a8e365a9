"""Time per minibatch and peak memory of every method relative to backprop (same model).

    python benchmarks/bench_methods.py                     # RevNet18, CIFAR stem, width 64, batch 64, 2 threads
    python benchmarks/bench_methods.py --no-channels-last  # contiguous NCHW (default: channels-last, as a run)

Each method runs in its own process (so peak RSS is its own). Time per minibatch is measured in
the pipeline's steady state: for pipelined methods one tick does one forward and one backward at
every stage, i.e. the whole compute of one minibatch; for sequential methods a minibatch takes
2J - 1 ticks. The ideal FLOP ratio against backprop is 4/3 for methods that recompute
(revbackprop, dsp, petra) and 1 for delayed gradients with stashing (paper, Table 1).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

FLOP_RATIO = {"backprop": 1.0, "revbackprop": 4 / 3, "delayed": 1.0, "dsp": 4 / 3, "petra": 4 / 3}


def measure(args) -> dict:
    import torch

    from petra_core import Recipe, Simulator, build_model
    from petra_core.engine.host_memory import retain_freed_memory

    torch.set_num_threads(args.threads)
    retain_freed_memory()  # as a run does (host_memory.py)
    torch.manual_seed(0)
    model = build_model(args.arch, num_classes=10, width=args.width)
    x = torch.randn(args.batch, 3, 32, 32)
    if args.channels_last:  # as a run does by default (RunConfig.channels_last)
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (args.batch,))
    J = len(model)
    warm, timed = (2 * (J - 1) + 1, args.steps) if args.method not in ("backprop", "revbackprop") else (1, args.steps)
    n = warm + timed
    sim = Simulator(
        model,
        args.method,
        num_batches=n + 2 * J,
        get_batch=lambda mb: (x, y),
        batch_size=args.batch,
        recipe=Recipe(base_lr=0.01),
    )
    per_mb = sim.schedule.period if sim.schedule.one_in_flight else 1
    sim.run(warm * per_mb)
    start = time.perf_counter()
    sim.run(timed * per_mb)
    elapsed = time.perf_counter() - start
    kept = sum(sum(w.peak_kept.values()) for w in sim.workers)
    return {
        "method": args.method,
        "s_per_batch": elapsed / timed,
        "kept_MiB": kept / 2**20,
        "peak_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def default_channels_last() -> bool:
    """A run's default memory format, so the benchmark times what ``petra train`` runs."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from petra_core.run.config import RunConfig

    return RunConfig().channels_last


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="revnet18")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=8, help="timed minibatches per method")
    p.add_argument("--methods", default="backprop,revbackprop,delayed,dsp,petra")
    p.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=default_channels_last(),
        help="model and data in channels-last memory format (default: a run's default, %(default)s)",
    )
    p.add_argument("--method", help=argparse.SUPPRESS)  # internal: measure one method in this process
    p.add_argument(
        "--record",
        action="store_true",
        help="also write results/benchmarks/bench_methods-VARIANT.json (README's block is rendered from it)",
    )
    args = p.parse_args()
    if args.method:
        print(json.dumps(measure(args)))
        return
    recorder = None
    if args.record:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from petra_core.report.benchmarks import Recorder

        recorder = Recorder(
            "bench_methods", f"{args.arch}-w{args.width}-t{args.threads}" + ("-cl" if args.channels_last else "")
        )
    rows = []
    for method in args.methods.split(","):
        cmd = [sys.executable, __file__, "--method", method, *[a for a in sys.argv[1:] if a != "--record"]]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(f"  measured {method}", file=sys.stderr)
    base = next(r for r in rows if r["method"] == "backprop")
    print(
        f"{args.arch}, CIFAR stem, width {args.width}, batch {args.batch}, {args.threads} threads, "
        f"{'channels-last' if args.channels_last else 'contiguous NCHW'}, {args.steps} timed minibatches per method"
    )
    print(
        f"{'method':<12}{'s/batch':>9}{'x backprop':>12}{'ideal FLOPs':>13}{'peak RSS MiB':>14}"
        f"{'x backprop':>12}{'kept MiB':>10}"
    )
    for r in rows:
        print(
            f"{r['method']:<12}{r['s_per_batch']:>9.3f}{r['s_per_batch'] / base['s_per_batch']:>12.2f}"
            f"{FLOP_RATIO.get(r['method'], float('nan')):>13.2f}{r['peak_rss_MiB']:>14.0f}"
            f"{r['peak_rss_MiB'] / base['peak_rss_MiB']:>12.2f}{r['kept_MiB']:>10.0f}"
        )
    if recorder is not None:
        result = {
            "arch": args.arch,
            "width": args.width,
            "batch": args.batch,
            "threads": args.threads,
            "channels_last": args.channels_last,
            "steps": args.steps,
            "ideal_flop_ratio": FLOP_RATIO,
            "methods": {
                r["method"]: {
                    **r,
                    "time_vs_backprop": r["s_per_batch"] / base["s_per_batch"],
                    "rss_vs_backprop": r["peak_rss_MiB"] / base["peak_rss_MiB"],
                }
                for r in rows
            },
        }
        print(f"recorded: {recorder.write(result)}")


if __name__ == "__main__":
    main()
