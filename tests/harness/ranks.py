"""The rank program of the distributed tests and benchmarks: a pipeline on random data, with fault
injection, gathered weights and per-rank timings.

Launch with ``torchrun --nproc-per-node=N tests/harness/ranks.py ...`` or with ``--spawn N`` (local
processes on 127.0.0.1). ``demo_setup`` builds the same model, data and recipe in the test
process, for the simulator the ranks are compared with.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from petra_core.engine import Pipeline, PipelineSpec
from petra_core.engine.distributed import DEFAULT_TIMEOUT, DistributedWorld, PipelineError
from petra_core.engine.host_memory import retain_freed_memory
from petra_core.engine.launch import fail, init_distributed, launch_local
from petra_core.engine.observers import Observer
from petra_core.engine.placement import format_placement, format_stages
from petra_core.engine.spec import GetBatch
from petra_core.engine.stage_costs import measure_stage_costs
from petra_core.methods.schedule import fill_drain
from petra_core.models import StagedModel
from petra_core.optim import Recipe
from petra_core.replicas import get_rule

RANKS = __file__  # the program to launch: python RANKS ARGS, torchrun RANKS ARGS


def synthetic_batch(seed: int, mb: int, batch: int, image_size: int, num_classes: int) -> tuple[Tensor, Tensor]:
    """Minibatch ``mb`` of random images and labels: a pure function of its arguments."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + mb)
    return (
        torch.randn(batch, 3, image_size, image_size, generator=g),
        torch.randint(0, num_classes, (batch,), generator=g),
    )


def synthetic_text(seed: int, mb: int, batch: int, context: int, vocab: int) -> tuple[Tensor, Tensor]:
    """Minibatch ``mb`` of random token windows and their next tokens: a pure function of its arguments."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + mb)
    text = torch.randint(0, vocab, (batch, context + 1), generator=g)
    return text[:, :-1].contiguous(), text[:, 1:].contiguous()


def demo_setup(args: argparse.Namespace) -> tuple[StagedModel, GetBatch, Recipe]:
    """Model (seeded), data and recipe of the demo run; the tests rebuild the same for the simulator.
    A character-level arch (``revgpt``, ``gpt``) trains on random token windows of ``--context``,
    with ``--depth`` blocks of 2 heads."""
    from petra_core.families import CHARACTERS, build_model
    from petra_core.families import build as build_any

    torch.manual_seed(args.seed)
    text = args.arch in CHARACTERS.archs
    if text:
        model = build_any(
            args.arch,
            num_classes=args.num_classes,
            width=args.width,
            depth=args.depth,
            heads=2,
            context=args.context,
            aux_head=args.aux_head,
        )
    else:
        model = build_model(
            args.arch, num_classes=args.num_classes, width=args.width, stem=args.stem, aux_head=args.aux_head
        )

    def get_batch(mb: int):
        if text:
            return synthetic_text(args.seed, mb, args.batch, args.context, args.num_classes)
        return synthetic_batch(args.seed, mb, args.batch, args.image_size, args.num_classes)

    recipe = Recipe(base_lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay, scale_lr=False)
    return model, get_batch, recipe


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tests/harness/ranks.py",
        description="Distributed PETRA pipeline on random data (one process per rank). Launch with "
        "torchrun --nproc-per-node=N, or with --spawn N for local processes.",
    )
    p.add_argument("--arch", default="revnet18")
    p.add_argument("--width", type=int, default=16, help="base channel count (64 = the paper's models)")
    p.add_argument("--stem", default="cifar", choices=["cifar", "imagenet"])
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--num-classes", type=int, default=10, help="classes, or the vocabulary of a text arch")
    p.add_argument("--context", type=int, default=16, help="tokens per window (text archs)")
    p.add_argument("--depth", type=int, default=2, help="transformer blocks (text archs)")
    p.add_argument(
        "--method", default="petra", help="method (NAME+spanS: bounded rebuild chains), or several separated by commas"
    )
    p.add_argument(
        "--aux-head",
        default=None,
        choices=["cnn", "linear"],
        help="auxiliary heads on the stages (needed by local, fg-local-w, fg-local-a)",
    )
    p.add_argument("--k", type=int, default=1, help="gradient accumulation")
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="data-parallel replicas: the ranks form a mesh of replicas x (ranks / replicas) positions",
    )
    p.add_argument("--rule", default="dp", help="replica rule (petra_core.replicas.REPLICA_RULES)")
    p.add_argument("--rule-stages", type=int, default=None, help="cdp1/cdp2: the stage groups L")
    p.add_argument(
        "--rule-options", type=json.loads, default=None, help="the rule's options as JSON, e.g. '{\"p\": 0.1}'"
    )
    p.add_argument("--steps", type=int, default=20, help="minibatches per replica (optimizer steps when k = 1)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--placement", default="even", help="'even', 'balanced' (measured) or ranges '0-3,4-9'")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds before a silent peer is declared failed"
    )
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in each rank")
    p.add_argument("--save", default=None, help="rank 0 saves the gathered state_dict here ({method} is substituted)")
    p.add_argument(
        "--json", default=None, help="rank 0 writes throughput and per-rank timings here ({method} substituted)"
    )
    p.add_argument("--warmup", type=int, default=1, help="minibatches excluded from the throughput (per end)")
    p.add_argument(
        "--fault",
        default=None,
        metavar="RANK:TICK:KIND",
        help="fault injection at the start of tick TICK on rank RANK: kill (SIGKILL itself), "
        "exit (os._exit(3)) or hang (stop making progress)",
    )
    p.add_argument(
        "--where",
        default=None,
        metavar="PATH",
        help="each rank writes its RANK, LOCAL_RANK, mesh coordinate, stages and device to PATH.RANK.json",
    )
    p.add_argument(
        "--spawn",
        type=int,
        default=0,
        metavar="N",
        help="launch N local ranks on 127.0.0.1 (instead of torchrun) and wait for them",
    )
    return p


class Fetched(Observer):
    """The stream's minibatches this rank fed to stage 0."""

    def __init__(self):
        self.minibatches: list[int] = []

    def fetched(self, replica: int, mb: int, batch) -> None:
        self.minibatches.append(mb)


@dataclass
class Timings:
    """Wall-clock of one rank's ticks, and its transport's share (seconds, bytes)."""

    rank: int
    replica: int
    stages: str
    ticks: int
    wall_s: float
    compute_s: float
    recv_wait_s: float
    send_s: float
    background_recv_s: float
    bytes_sent: int
    bytes_received: int
    tick_ends: list[float]  # perf_counter() at the end of each tick


def gather_head_log(pipe: Pipeline) -> list | None:
    """Every rank's head records on rank 0, by minibatch (None elsewhere)."""
    logs = pipe.gather_object(pipe.head_log)
    return None if logs is None else sorted((r for log in logs for r in log), key=lambda r: r.mb)


def timings(pipe: Pipeline) -> Timings:
    s = pipe.world.transport.stats
    return Timings(
        pipe.rank,
        pipe.world.placement.replica,
        format_stages(pipe.stages),
        pipe.tick,
        pipe.wall_s,
        pipe.wall_s - s.recv_wait_s - s.send_s,
        s.recv_wait_s,
        s.send_s,
        s.background_recv_s,
        s.bytes_sent,
        s.bytes_received,
        list(pipe.tick_ends),
    )


def throughput(pipe: Pipeline, timings: list[Timings], batch: int, warmup: int) -> dict:
    """Images/s over the whole run, and over the window where the pipeline is full (pipelined
    schedules: ticks 2(J-1) .. n; flushed ones: from the first flush group after ``warmup``
    minibatches to the end, whole groups)."""
    sch, n = pipe.schedule, pipe.schedule.num_batches
    batch = batch * pipe.world.placement.mesh.replicas  # every replica trains on its own minibatches
    total = max(t.wall_s for t in timings)
    out = {"images_per_s": n * batch / total if total > 0 else 0.0, "wall_s": total}
    if not sch.fixed_weights_in_flight:
        a, b = fill_drain(sch.num_stages), n
        count = b - a
    else:
        first = -(-warmup // sch.group_size) * sch.group_size
        a, b = sch.forward_tick(first, 0), sch.num_ticks
        count = n - first
    if count > 0 and a > 0:
        spans = [t.tick_ends[b - 1] - t.tick_ends[a - 1] for t in timings]
        out["steady_images_per_s"] = count * batch / max(spans)
        out["steady_window"] = f"ticks {a}-{b - 1}, {count} minibatches"
    return out


def method_of(name: str):
    """A method by name, ``NAME+spanS`` for its bounded rebuild chains (``Method.bounded``)."""
    from petra_core.methods import get_method

    base, _, span = name.partition("+span")
    return get_method(base).bounded(int(span or 0))


def build_pipeline(args, method: str, device: torch.device) -> Pipeline:
    """This rank's pipeline of the demo run (every rank builds the same spec in its own world)."""
    model, get_batch, recipe = demo_setup(args)
    world = DistributedWorld(device, timeout=args.timeout, replicas=args.replicas)
    return Pipeline.build(
        PipelineSpec(
            model=model,
            method=method_of(method),
            recipe=recipe,
            num_batches=args.steps,
            k=args.k,
            rule=get_rule(args.rule, stages=args.rule_stages, options=args.rule_options, seed=0),
            world=world,
            get_batch=get_batch,
            batch_size=args.batch,
            placement=args.placement,
            measure=measure_stage_costs,
            sync_timing=device.type == "cuda",
        )
    )


def fault_of(args, rank: int) -> tuple[int, str] | None:
    """(tick, kind) of the fault this rank injects (``--fault RANK:TICK:KIND``), None if none."""
    if not args.fault:
        return None
    r, t, kind = args.fault.split(":")
    if kind not in ("kill", "exit", "hang"):
        raise ValueError(f"unknown fault kind {kind!r}; allowed: kill, exit, hang")
    return (int(t), kind) if int(r) == rank else None


def inject(pipe: Pipeline, kind: str) -> None:
    print(
        f"petra: fault injection: {kind} on {pipe.world.placement.describe()} at tick {pipe.tick}",
        file=sys.stderr,
        flush=True,
    )
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "exit":
        os._exit(3)
    while True:  # hang: the watchdog ends the process once a neighbour reports it
        time.sleep(1)


def write_where(path: str, pipe: Pipeline, fetched: Fetched) -> None:
    """This rank's place in the run (``--where``)."""
    with open(f"{path}.{pipe.rank}.json", "w") as f:
        json.dump(
            {
                "rank": pipe.rank,
                "local_rank": int(os.environ.get("LOCAL_RANK", -1)),
                "group_rank": int(os.environ.get("GROUP_RANK", -1)),
                "replica": pipe.world.placement.replica,
                "position": pipe.world.placement.position,
                "stages": format_stages(pipe.stages),
                "device": str(pipe.workers[0].device),
                "fetched": fetched.minibatches,
            },
            f,
        )


def report(args, method: str, device: torch.device, pipe: Pipeline, log: list, all_timings: list[Timings]) -> None:
    """Rank 0: throughput and per-rank timings, printed and (``--json``) written."""
    fmt = lambda s: s.replace("{method}", method)  # noqa: E731
    tp = throughput(pipe, all_timings, args.batch, args.warmup)
    steady = ""
    if "steady_window" in tp:
        steady = f", steady {tp['steady_images_per_s']:.1f} images/s ({tp['steady_window']})"
    print(
        f"petra distributed: {method} {args.arch} width {args.width} batch {args.batch} on {pipe.world_size} "
        f"ranks ({device.type}, mesh {pipe.world.placement.mesh} replicas x positions), "
        f"placement {format_placement(pipe.placement)}: {tp['images_per_s']:.1f} images/s"
        f"{steady}" + (f", last loss {log[-1].loss:.4f}" if log else ""),
        flush=True,
    )
    for t in all_timings:
        print(
            f"  rank {t.rank} ({t.stages}): compute {t.compute_s:.2f} s, waiting {t.recv_wait_s:.2f} s, "
            f"send {t.send_s:.2f} s, background recv {t.background_recv_s:.2f} s, "
            f"sent {t.bytes_sent / 2**20:.1f} MiB",
            flush=True,
        )
    if args.json:
        rows = [{k: v for k, v in asdict(t).items() if k != "tick_ends"} for t in all_timings]
        with open(fmt(args.json), "w") as f:
            json.dump(
                {
                    "method": method,
                    "world_size": pipe.world_size,
                    "replicas": pipe.world.placement.mesh.replicas,
                    "device": device.type,
                    "placement": format_placement(pipe.placement),
                    "stage_costs": pipe.stage_costs,
                    **tp,
                    "ranks": rows,
                    "losses": [r.loss for r in log],
                },
                f,
                indent=1,
            )


def run_one(args, method: str, device: torch.device) -> None:
    pipe = build_pipeline(args, method, device)
    fetched = Fetched()
    pipe.observers.append(fetched)
    fault = fault_of(args, pipe.rank)
    while not pipe.done:
        if fault is not None and pipe.tick == fault[0]:
            inject(pipe, fault[1])
        pipe.advance()
    if args.where:
        write_where(args.where, pipe, fetched)
    sd, log, all_timings = pipe.gather_state_dict(), gather_head_log(pipe), pipe.gather_object(timings(pipe))
    pipe.close()
    if pipe.rank != 0:
        return
    if args.save:
        torch.save(sd, args.save.replace("{method}", method))
    report(args, method, device, pipe, log, all_timings)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.spawn:
        argv = list(sys.argv[1:] if argv is None else argv)
        rest = [
            a
            for i, a in enumerate(argv)
            if not (a == "--spawn" or a.startswith("--spawn=") or (i > 0 and argv[i - 1] == "--spawn"))
        ]
        procs = launch_local(rest, args.spawn, script=__file__)
        codes = [p.returncode for p in procs]
        return 0 if all(c == 0 for c in codes) else 1
    if args.threads:
        torch.set_num_threads(args.threads)
    retain_freed_memory()  # as a run does: every tick frees and reallocates the same buffers (host_memory.py)
    try:
        device = init_distributed(
            None if args.device != "cpu" else "gloo",
            timeout=args.timeout,
            device=None if args.device == "auto" else args.device,
        )
        for method in args.method.split(","):
            run_one(args, method.strip(), device)
        dist.barrier()
        dist.destroy_process_group()
    except PipelineError as err:
        fail(err)
    except Exception as err:  # noqa: BLE001 - any other failure must not leave the other ranks waiting
        import traceback

        traceback.print_exc()
        rank = os.environ.get("RANK", "?")
        fail(PipelineError(f"petra: rank {rank} failed before or outside the pipeline: {type(err).__name__}: {err}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
