"""Print Table 1 (measured vs paper) and Table 3 (paper, re-implemented formula, real shapes).

    python benchmarks/bench_accounting.py                 # ImageNet shapes, RevNet18 + RevNet50
    python benchmarks/bench_accounting.py --quick         # tiny shapes, seconds
    python benchmarks/bench_accounting.py --out results/  # also write the tidy tables as CSV

Plain-text output only; the report layer renders the CSVs.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import pandas as pd
import torch

from petra_core import build_model
from petra_core.accounting import costs, measure_steady_state

pd.set_option("display.width", 200)
pd.set_option("display.max_columns", 40)


def show_table3(df: pd.DataFrame) -> pd.DataFrame:
    order = ["paper", "formula", "formula_conv_bias", "real", "real_no_stem", "real_engine"]
    gb = df.pivot(index="row", columns="accounting", values="memory_gb")[order]
    sv = df.pivot(index="row", columns="accounting", values="saving_pct")[order]
    flags = df.drop_duplicates("row").set_index("row")[["input_buffer", "param_buffer"]]
    out = flags.join(gb.round(2)).join(sv.round(1).add_suffix(" %"))
    print("Table 3 — RevNet50, ImageNet 224, batch 64, k = 1, 18 stages (GB = 1e9 B; saving vs row 1, %)")
    print(out.to_string())
    return df


def show_memory_check(quick: bool) -> pd.DataFrame:
    cfg = dict(batch=4, image_size=8, width=4) if quick else dict(batch=16, image_size=32, width=16)
    rows = []
    for method in ("dsp", "petra", "delayed"):
        torch.manual_seed(0)
        model = build_model("revnet18", num_classes=10, width=cfg["width"])
        r = measure_steady_state(model, method, batch=cfg["batch"], image_size=cfg["image_size"])
        pred = r["predicted_bytes"]
        rows.append(
            dict(
                method=method,
                tick=r["tick"],
                allocated_MB=r["allocated_bytes"] / 1e6,
                predicted_MB=None if pred is None else pred / 1e6,
                held_by_policies_MB=r["held_bytes"] / 1e6,
                predicted_buffers_MB=None if r["predicted_buffer_bytes"] is None else r["predicted_buffer_bytes"] / 1e6,
                allocated_vs_predicted_pct=None if pred is None else 100 * (r["allocated_bytes"] / pred - 1),
            )
        )
    df = pd.DataFrame(rows)
    print(
        f"\nMeasured memory at a steady-state tick — RevNet18, CIFAR stem {cfg['image_size']}², width {cfg['width']}, "
        f"batch {cfg['batch']} (allocator = torch.profiler CPU memory events; prediction = real-shape accounting "
        f"+ messages in flight + momentum; delayed keeps graphs, not predictable from shapes)"
    )
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return df


def show_table1(arch: str, frames: dict, seconds: float) -> None:
    df, rows, net = frames["table1_per_stage"], frames["table1"], frames["network_costs"]
    stage, J = int(rows.stage.iloc[0]), int(rows.J.iloc[0])
    print(
        f"\nTable 1 — {arch}, J = {J}; per-stage columns at stage j = {stage + 1} (1-based, "
        f"{df.kind[df.stage == stage].iloc[0]}); measured in {seconds:.0f} s"
    )
    wide = rows.pivot(index="method", columns="quantity", values=["paper", "measured"]).reindex(rows.method.unique())
    cols = [(src, q) for q in ("activations", "params", "comm", "flops", "time") for src in ("paper", "measured")]
    wide = wide[cols]
    wide.columns = [f"{q} {'paper' if src == 'paper' else 'meas.'}" for src, q in cols]
    wide["flops paper"] /= J
    wide["flops meas."] /= J
    print(wide.round(2).to_string())
    print("  activations: stage inputs kept at steady state; params: weight copies (live + stash); comm: bytes a")
    print("  stage receives in backward per minibatch / the ResNet's backprop gradient message; flops: whole")
    print("  network per minibatch in units of J mean stage forwards; time: per batch in mean backprop stage")
    print("  forwards: sequential = sum over stages, pipelined = the slowest stage's forward + rebuild + backward.")
    notes = rows[rows.note != ""][["method", "quantity", "note"]]
    print(notes.to_string(index=False))
    print(
        net[
            [
                "method",
                "flops",
                "time_serial_s",
                "time_parallel_s",
                "time_serial_units",
                "time_parallel_units",
                "time_balanced_units",
            ]
        ].to_string(index=False, float_format=lambda v: f"{v:.4g}")
    )
    pet = df[(df.method == "petra") & (df.kind != "H")][
        [
            "stage",
            "kind",
            "fwd_sent_vs_resnet",
            "bwd_sent_vs_resnet",
            "bwd_received_vs_resnet",
            "bwd_received_vs_backprop",
        ]
    ]
    print(
        "  PETRA communication per stage (× the ResNet's backprop message of that stage; last column × this RevNet's):"
    )
    print(pet.to_string(index=False, float_format=lambda v: f"{v:.2f}"))


def show_fidelity(df: pd.DataFrame, every: int) -> None:
    print(
        f"\nGradient fidelity — RevNet18 width 8, 16², batch 8, k = 2, lr 0.005, every {every} steps: cosine to "
        f"backprop at the current weights (stage rows, step columns)"
    )
    print(df.pivot_table(index=["method", "stage"], columns="step", values="cosine").round(4).to_string())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes (smoke test)")
    ap.add_argument("--archs", nargs="+", default=["revnet18", "revnet50"])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--num-batches", type=int, default=3, help="minibatch 0 counts FLOPs, the rest are timed")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: stable on shared cores)")
    ap.add_argument("--out", type=Path, help="write the tidy tables as CSV into this folder")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {args.threads} thread(s)")
    cfg = dict(
        stem="imagenet",
        image_size=args.image_size,
        batch=args.batch,
        width=64,
        num_classes=1000,
        num_batches=args.num_batches,
    )
    if args.quick:
        cfg = dict(stem="cifar", image_size=8, batch=2, width=4, num_classes=10, num_batches=3)
    n, every = (40, 12) if args.quick else (120, 40)
    tables = {"memory_check": show_memory_check(args.quick)}
    for i, arch in enumerate(args.archs):  # the same measurement as `petra costs` (accounting.costs.measure)
        start = time.perf_counter()
        measured = costs.measure(
            {"threads": args.threads, "table1": {"arch": arch, **cfg}, "fidelity": {"num_batches": n, "every": every}}
        )
        frames = measured["frames"]
        if i == 0:
            tables["table3"] = show_table3(frames["table3"])
            show_fidelity(frames["fidelity"], every)
            tables["fidelity"] = frames["fidelity"]
        show_table1(arch, frames, time.perf_counter() - start)
        tables[f"per_stage_{arch}"], tables[f"table1_{arch}"] = frames["table1_per_stage"], frames["table1"]
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        for name, df in tables.items():
            df.to_csv(args.out / f"{name}.csv", index=False)
        print(f"\nwrote {', '.join(tables)} to {args.out}")


if __name__ == "__main__":
    main()
