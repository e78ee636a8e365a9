"""Time per training step: our engine against a plain PyTorch loop over the same model.

    python benchmarks/bench_speed.py                               # RevNet18, CIFAR stem, width 8, batch 64, 1 thread
    python benchmarks/bench_speed.py --width 64 --threads 2        # the paper's width
    python benchmarks/bench_speed.py --no-channels-last            # both sides in NCHW (default: channels-last)
    python benchmarks/bench_speed.py --compile                     # every stage's modules through torch.compile
    python benchmarks/bench_speed.py --methods petra,dsp,delayed   # more methods against backprop

Prints the ratios (issue 25's goals: backprop/plain <= 1.03; PETRA/backprop <= 4/3 + 0.05):

* ``backprop / plain`` — our backprop (sequential schedule through the stage workers) against a
  plain ``loss.backward(); opt.step(); sched.step()`` loop over a copy of the same model and recipe;
* ``METHOD / backprop`` — each method's steady-state time per minibatch against our backprop,
  beside its FLOP ideal (4/3 for a method that evaluates a stage's forward again at backward,
  1 otherwise; Table 1 of the paper).

The process keeps freed host memory (``petra_core.engine.host_memory``, as every petra pipeline
does), so the plain loop runs on the same allocator setting; ``PETRA_HOST_MALLOC=system`` runs all
of them on glibc's defaults. Page faults per step are printed for each loop.

Everything runs in one process and the three loops are timed in alternating blocks, so a change
of load on a shared machine hits all of them alike; each ratio is the median over the blocks.
A step is one minibatch: forward, backward and optimizer update of every stage (for pipelined
methods one tick, which does one forward and one backward at every stage).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
import torch.nn.functional as F
from bench_methods import FLOP_RATIO  # Table 1's FLOPs per minibatch against backprop, one table for both

from petra_core import Recipe, Simulator, build_model
from petra_core.engine.host_memory import page_faults, retain_freed_memory
from petra_core.methods import check_method_fits, get_method
from petra_core.optim import make_optimizer
from petra_core.run.config import RunConfig


def plain_loop(model, x, y, recipe: Recipe):
    """A plain PyTorch training step over ``model``: the same SGD recipe and learning-rate
    schedule, one optimizer (the engine has one per stage)."""
    opt, sched = make_optimizer(model, recipe, batch_size=len(y), k=1, steps_per_epoch=1000)

    def step():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)

    return step


def engine_loop(model, method: str, x, y, recipe: Recipe, **kwargs):
    """One minibatch through the engine per call, in the pipeline's steady state."""
    sim = Simulator(
        model, method, num_batches=10**7, get_batch=lambda mb: (x, y), batch_size=len(y), recipe=recipe, **kwargs
    )
    per_batch = sim.schedule.period if sim.schedule.one_in_flight else 1
    sim.run(2 * len(model) * per_batch)  # fill the pipeline

    def step():
        sim.run(per_batch)

    return step


def compiled(model):
    """``model`` with the direct children of each stage compiled in place (blocks, couplings, the
    head): a stage's forward and PETRA's rebuild both call them, and the stage's own code (which
    splits and joins streams, or reconstructs) stays eager."""
    for stage in model:
        for child in stage.children():
            child.compile()
    return model


def timed(step, n: int, faults: list[float] | None = None) -> float:
    """Seconds per call of ``step`` over ``n`` calls (and, into ``faults``, page faults per call)."""
    before, start = page_faults(), time.perf_counter()
    for _ in range(n):
        step()
    elapsed = (time.perf_counter() - start) / n
    if faults is not None:
        faults.append((page_faults() - before) / n)
    return elapsed


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="revnet18")
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=5, help="steps per timed block")
    p.add_argument("--blocks", type=int, default=7, help="alternating timed blocks per loop")
    p.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=RunConfig().channels_last,
        help="model and data in channels-last memory format (default: a run's default, %(default)s)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile every stage's submodules (forward and, for PETRA, the rebuild use them)",
    )
    p.add_argument(
        "--methods",
        default="petra",
        help="methods timed against backprop, comma-separated (default petra; reversible ones need a RevNet)",
    )
    p.add_argument("--json", help="also write the results here")
    p.add_argument(
        "--record",
        action="store_true",
        help="also write results/benchmarks/bench_speed-VARIANT.json (README's block is rendered from it)",
    )
    return p


def build_loops(args, error) -> tuple[dict, list[str]]:
    """The loops to time (plain, backprop and each method that applies) and the methods timed
    against backprop. ``error``: the parser's, for a method that cannot run on this model."""
    methods = [m for m in args.methods.split(",") if m]
    for m in methods:
        get_method(m)  # an unknown name is one line naming the allowed ones
    torch.manual_seed(0)
    base = build_model(args.arch, num_classes=10, width=args.width)
    x, y = torch.randn(args.batch, 3, 32, 32), torch.randint(0, 10, (args.batch,))
    if args.channels_last:
        base = base.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    recipe = Recipe(base_lr=0.01)
    prepare = compiled if args.compile else (lambda model: model)
    loops = {
        "plain": plain_loop(prepare(copy.deepcopy(base)), x, y, recipe),
        "backprop": engine_loop(prepare(copy.deepcopy(base)), "backprop", x, y, recipe),
    }
    for m in methods:
        if m == "backprop" or (get_method(m).needs_reversible and not base.reversible_stages):
            continue  # PETRA on a ResNet: nothing to time
        try:
            check_method_fits(get_method(m), base)
        except ValueError as err:  # local learning needs auxiliary heads, which this model has not
            error(str(err))
        loops[m] = engine_loop(prepare(copy.deepcopy(base)), m, x, y, recipe)
    return loops, [m for m in loops if m not in ("plain", "backprop")]


def print_result(args, result: dict) -> None:
    print(
        f"{args.arch}, CIFAR stem, width {args.width}, batch {args.batch}, {args.threads} thread(s)"
        + (", channels-last" if args.channels_last else "")
        + (", torch.compile" if args.compile else "")
        + f"; median of {args.blocks} alternating blocks of {args.steps} steps"
    )
    for name, s in result["s_per_step"].items():
        print(f"  {name:<11} {1000 * s:8.1f} ms/step {result['page_faults_per_step'][name]:8.0f} page faults/step")
    for name, r in result["ratio"].items():
        ideal = result["ideal"].get(name)
        print(f"  {name:<19} {r:6.3f}" + ("" if ideal is None else f"   FLOP ideal {ideal:.3f}"))


def main(argv=None) -> dict:
    p = parser()
    args = p.parse_args(argv)
    recorder = None
    if args.record:
        from petra_core.report.benchmarks import Recorder

        recorder = Recorder(
            "bench_speed",
            f"{args.arch}-w{args.width}-t{args.threads}"
            + ("-cl" if args.channels_last else "")
            + ("-compile" if args.compile else ""),
        )
    retain_freed_memory()
    torch.set_num_threads(args.threads)
    loops, others = build_loops(args, p.error)
    for step in loops.values():  # warm-up: allocator, oneDNN primitive caches
        timed(step, 2)
    times: dict[str, list[float]] = {name: [] for name in loops}
    faults: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(args.blocks):
        for name, step in loops.items():
            times[name].append(timed(step, args.steps, faults[name]))
    ratio = {"backprop/plain": statistics.median(b / a for a, b in zip(times["plain"], times["backprop"]))}
    for m in others:
        ratio[f"{m}/backprop"] = statistics.median(b / a for a, b in zip(times["backprop"], times[m]))
    result = {
        "arch": args.arch,
        "width": args.width,
        "batch": args.batch,
        "threads": args.threads,
        "channels_last": args.channels_last,
        "compile": args.compile,
        "host_malloc": "retain" if retain_freed_memory() else "system",
        "s_per_step": {name: statistics.median(t) for name, t in times.items()},
        "page_faults_per_step": {name: statistics.median(f) for name, f in faults.items()},
        "ideal": {f"{m}/backprop": FLOP_RATIO[m] for m in others if m in FLOP_RATIO},
        "ratio": ratio,
    }
    print_result(args, result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if recorder is not None:
        print(f"recorded: {recorder.write(result)}")
    return result


if __name__ == "__main__":
    main()
