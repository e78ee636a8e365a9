"""ACCO's overlap, measured: step time of ACCO (timing mode) against DDP and ZeRO-1 on 2 gloo ranks.

Each rank trains a whole ResNet18 (CIFAR stem) on random 32×32 data, one thread
(``petra_core/replicas/timing.py``). A DDP or ZeRO-1 step computes 2n micro-batches, then
communicates (all-reduce; or reduce-scatter, the shard's step, all-gather), nothing overlapping.
An ACCO step is two rounds, each computing at least n micro-batches and more until the round's
communication (tentative, then real) is done. Settings:

* ``loopback``: gloo on 127.0.0.1, as it is;
* ``1 Gbit/s`` (``--gbit``): every collective held back by its ring bytes ÷ the bandwidth;
* ``slow worker``: the same link, and rank 1 sleeping as long again as it computes (2× slower).

Printed per setting and method: compute (the slowest rank's), communication (the least over the
ranks: the others' includes waiting for the slowest) and step seconds per step (mean over the
steps after the first), micro-batches per step (summed over ranks), seconds per micro-batch (the
fair measure when ACCO's count varies) and the ratio ACCO / DDP of it, against the ideal
max(c, m) / (c + m) with c and m DDP's compute and communication per step (the ideal when
communication hides entirely behind computation; ACCO communicates twice per step, so its own
bound is max(c, 2m) / (c + m)). With the slow worker the ideal time per micro-batch is every rank
computing all the time, 1 / Σ_r 1/c_r. Then the optimizer-state memory per worker (AdamW, the
paper's ResNet18 at width 64), unsharded against sharded over N = 2 and 4 replicas, from the
engine's rules.

    python benchmarks/bench_acco.py                 # ~3-6 min on 2 idle CPU cores
    python benchmarks/bench_acco.py --json results/acco/overlap.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from petra_core.engine.launch import launch_local  # noqa: E402


def settings(gbit: float) -> list[dict]:
    return [
        {"name": "loopback", "gbit_s": None, "slow": 0.0},
        {"name": f"{gbit:g} Gbit/s", "gbit_s": gbit, "slow": 0.0},
        {"name": f"{gbit:g} Gbit/s, rank 1 2x slower", "gbit_s": gbit, "slow": 1.0},
    ]


# ---- the rank program -----------------------------------------------------------------------------------
def rank_main(args) -> int:
    import torch.distributed as dist

    from petra_core.families import build_model
    from petra_core.optim import Recipe, make_optimizer
    from petra_core.replicas.timing import RUNNERS, Collectives, Link, Worker

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, R = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    pool = [
        (torch.randn(args.batch, 3, 32, 32, generator=g), torch.randint(0, 10, (args.batch,), generator=g))
        for _ in range(8)
    ]
    results = []
    for setting in settings(args.gbit):
        for method in args.methods.split(","):
            torch.manual_seed(0)
            model = build_model("resnet18", num_classes=10, width=args.width)
            opt, _ = make_optimizer(
                model,
                Recipe(base_lr=1e-3, weight_decay=0.0, optimizer="adamw"),
                batch_size=args.batch,
                k=1,
                steps_per_epoch=100,
            )
            worker = Worker(
                model, opt, lambda mb: pool[mb % len(pool)], R, rank, slow=setting["slow"] if rank == 1 else 0.0
            )
            dist.barrier()
            records = RUNNERS[method](
                worker, Collectives(dist.group.WORLD, Link(setting["gbit_s"])), args.steps, args.n
            )
            results.append({"setting": setting["name"], "method": method, "rank": rank, "records": records})
    gathered = [None] * R
    dist.all_gather_object(gathered, results)
    if rank == 0:
        Path(args.rank_out).write_text(json.dumps([r for part in gathered for r in part]))
    dist.destroy_process_group()
    return 0


# ---- the report ----------------------------------------------------------------------------------------
def summarise(rows: list[dict], skip: int = 1) -> dict:
    """(setting, method) -> per-step means over the ranks' steps after the first ``skip``."""
    out: dict = {}
    for row in rows:
        steps = row["records"][skip:]
        key = (row["setting"], row["method"])
        entry = out.setdefault(key, {"ranks": {}})
        mean = {k: sum(s[k] for s in steps) / len(steps) for k in steps[0]}
        entry["ranks"][row["rank"]] = mean
    for entry in out.values():
        ranks = entry["ranks"].values()
        entry["step_s"] = max(r["step_s"] for r in ranks)
        entry["compute_s"] = max(r["compute_s"] for r in ranks)
        entry["comm_s"] = min(r["comm_s"] for r in ranks)  # the others' includes waiting for the slowest rank
        entry["micro_batches"] = sum(r["micro_batches"] for r in ranks)
        entry["s_per_micro_batch"] = entry["step_s"] / entry["micro_batches"]
        entry["s_per_micro_batch_by_rank"] = {
            r: v["compute_s"] / v["micro_batches"]  # compute (and a slow
            for r, v in entry["ranks"].items()
        }  # worker's sleep) alone
    return out


def memory(width: int) -> list[dict]:
    """Optimizer-state bytes per worker, AdamW on ResNet18 at ``width``: unsharded (dp) against the
    sharded rules' shard, and the weight versions ACCO keeps besides (the engine's rules)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from petra_core import Recipe, Simulator, build_model
    from petra_core.replicas import get_rule

    recipe = Recipe(base_lr=1e-3, weight_decay=5e-4, optimizer="adamw")
    g = torch.Generator().manual_seed(0)
    out = []
    for R in (2, 4):
        data = [(torch.randn(2, 3, 32, 32, generator=g), torch.randint(0, 10, (2,), generator=g)) for _ in range(2 * R)]
        row = {"replicas": R}
        for name in ("dp", "zero1", "acco"):
            torch.manual_seed(0)
            model = build_model("resnet18", num_classes=10, width=width)
            rule = get_rule(name)
            sim = Simulator(
                model,
                "backprop",
                num_batches=2,
                get_batch=data.__getitem__,
                batch_size=2,
                k=2,
                recipe=recipe,
                replicas=R,
                rule=rule,
            ).run()
            row["params"] = sum(p.numel() for p in model.parameters())
            if name == "dp":
                row["dp_optimizer_state"] = max(
                    sum(
                        v.numel() * v.element_size()
                        for w in rep.workers
                        for s in w.optimizer.state.values()
                        for v in s.values()
                        if torch.is_tensor(v)
                    )
                    for rep in sim.replicas
                )
            else:
                held = rule.memory_bytes()
                row[f"{name}_optimizer_state"] = held["optimizer_state"]
                row[f"{name}_shard"] = held["shard"]
                row[f"{name}_versions"] = held["versions"]
        out.append(row)
    return out


def report_setting(setting: dict, summary: dict, methods: list[str]) -> dict | None:
    """Print one emulated link's table (every method against DDP) and return its report entry,
    with ACCO's ideal ratio, when DDP ran (None otherwise)."""
    name = setting["name"]
    ddp = summary.get((name, "ddp"))
    print(f"\n{name}")
    print(
        f"  {'method':<7} {'compute s':>10} {'comm s':>8} {'step s':>8} {'micro/step':>11} {'s/micro':>9} {'vs ddp':>7}"
    )
    for method in methods:
        e = summary[(name, method)]
        ratio = e["s_per_micro_batch"] / ddp["s_per_micro_batch"] if ddp else float("nan")
        e["ratio_to_ddp"] = ratio
        print(
            f"  {method:<7} {e['compute_s']:>10.3f} {e['comm_s']:>8.3f} {e['step_s']:>8.3f} "
            f"{e['micro_batches']:>11.1f} {e['s_per_micro_batch']:>9.4f} {ratio:>7.2f}"
        )
    if ddp:
        c, m = ddp["compute_s"], ddp["comm_s"]
        ideal = max(c, m) / (c + m)
        ideal_two = max(c, 2 * m) / (c + m)
        line = (
            f"  ideal ACCO / DDP: max(c, m)/(c + m) = {ideal:.2f}; with ACCO's two rounds max(c, 2m)/(c + m) "
            f"= {ideal_two:.2f}"
        )
        entry = {"setting": name, "ideal": ideal, "ideal_two_rounds": ideal_two}
        if setting["slow"]:
            per = [summary[(name, "acco")]["s_per_micro_batch_by_rank"][r] for r in (0, 1)]
            busy = 1 / sum(1 / c_r for c_r in per)
            entry["ideal_busy_s_per_micro_batch"] = busy
            entry["ideal_busy_ratio"] = busy / ddp["s_per_micro_batch"]
            line += f"; every rank busy: {busy:.4f} s/micro = {entry['ideal_busy_ratio']:.2f} of DDP"
        print(line)
        entry["methods"] = {m_: summary[(name, m_)] for m_ in methods}
        return entry
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=16, help="ResNet18's base width on the ranks")
    p.add_argument("--batch", type=int, default=32, help="images per micro-batch")
    p.add_argument("--n", type=int, default=2, help="micro-batches per round at least (a DDP step: 2n)")
    p.add_argument("--steps", type=int, default=6, help="optimizer steps per method (the first is not counted)")
    p.add_argument("--gbit", type=float, default=1.0, help="the emulated link, Gbit/s")
    p.add_argument("--methods", default="ddp,zero1,acco")
    p.add_argument("--memory-width", type=int, default=64, help="ResNet18's width for the memory table (0: skip)")
    p.add_argument("--json", default=None, help="also write everything measured here")
    p.add_argument(
        "--record",
        action="store_true",
        help="also write results/benchmarks/bench_acco-VARIANT.json (README's block is rendered from it)",
    )
    p.add_argument("--rank-out", default=None, help=argparse.SUPPRESS)  # the rank program's output
    args = p.parse_args()
    if args.rank_out:
        return rank_main(args)
    recorder = None
    if args.record:
        from petra_core.report.benchmarks import Recorder

        recorder = Recorder("bench_acco", f"w{args.width}-n{args.n}-{args.gbit:g}gbit")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ranks.json"
        argv = [a for a in sys.argv[1:] if a != "--record"]
        procs = launch_local([*argv, "--rank-out", str(out)], 2, timeout=1800, capture=True, script=__file__)
        for r, proc in enumerate(procs):
            if proc.returncode != 0:
                raise SystemExit(f"rank {r} exited {proc.returncode}:\n{proc.err[-3000:]}")
        rows = json.loads(out.read_text())
    summary = summarise(rows)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(
        f"ResNet18 width {args.width}, batch {args.batch} per micro-batch, n = {args.n} (DDP step: {2 * args.n} "
        f"micro-batches per rank), 2 gloo ranks x 1 thread, AdamW; {args.steps - 1} steps timed per method; "
        f"load average {load:.2f} before the report"
        if load is not None
        else ""
    )
    report = {
        "config": vars(args),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "load_average": load,
        "settings": [],
        "memory": [],
    }
    for setting in settings(args.gbit):
        entry = report_setting(setting, summary, args.methods.split(","))
        if entry is not None:
            report["settings"].append(entry)
    if args.memory_width:
        print(f"\noptimizer state per worker, AdamW, ResNet18 width {args.memory_width} (MiB)")
        for row in memory(args.memory_width):
            mib = 1 / 2**20
            print(
                f"  N = {row['replicas']}: {row['params'] / 1e6:.2f} M parameters; unsharded (dp) "
                f"{row['dp_optimizer_state'] * mib:.1f}; zero1 shard {row['zero1_optimizer_state'] * mib:.1f} "
                f"({row['zero1_optimizer_state'] / row['dp_optimizer_state']:.3f} of it); acco shard "
                f"{row['acco_optimizer_state'] * mib:.1f}; besides parameters and gradients acco holds at most "
                f"{row['acco_versions'] * mib:.1f} of weight versions and gradient stash, and its shard's copy "
                f"{row['acco_shard'] * mib:.1f} (the parameters themselves: {row['params'] * 4 * mib:.1f})"
            )
            report["memory"].append(row)
    if recorder is not None:
        print(f"recorded: {recorder.write(json.loads(json.dumps(report, default=str)))}")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=2, default=str) + "\n")
        tmp.replace(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
