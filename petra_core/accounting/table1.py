"""Table 1 measured: storage, communication, FLOPs and time per stage for the five methods.

Each method runs in the real engine (the simulator) under a :class:`Recorder`; the paper's
analytic entries (section ``table1`` of ``petra_core/paper_reference.yaml``) are evaluated beside the
measured ones, normalised as the paper does:

* activations: bytes a stage keeps between forward and backward at steady state, in stage inputs
  (per-minibatch bytes measured, times the minibatches in flight, ``Schedule.in_flight``: staleness
  2(J-j) when pipelined, 1 when sequential);
* params: copies of the stage's weights held (live weights + stashed versions, ceil(staleness/k));
* comm: payload (activation + gradient) per minibatch, in messages of backprop on the ResNet of
  the same stream width (the paper's convention for reversible methods) and on the same network;
* FLOPs: whole network per minibatch, in mean stage forwards (``FlopCounterMode``);
* time per batch (medians over the second half of the minibatches, :func:`steady_phases`):
  sequential methods = sum over stages; pipelined = the slowest stage's tick
  (forward + rebuild + backward on one device, as the worker runs them); also with forward and
  backward in parallel, and balanced over stages (the paper's ideal setting); in mean backprop
  stage forwards (see :func:`network_costs`).
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from ..engine import Simulator
from ..families import build_model
from ..methods import METHODS, get_method
from ..reference import evaluate_formula, load_reference
from .recorder import Recorder
from .shapes import FLOAT32, stage_shapes


def run_method(
    arch: str,
    method: str,
    *,
    stem: str = "imagenet",
    image_size: int = 224,
    batch: int = 2,
    num_batches: int = 3,
    width: int = 64,
    num_classes: int = 1000,
    k: int = 1,
    seed: int = 0,
    flops_minibatches=(0,),
    walk_held: bool = True,
) -> Recorder:
    """Run ``method`` on ``arch`` for ``num_batches`` random minibatches and return its recorder."""
    torch.manual_seed(seed)
    aux = "cnn" if get_method(method).needs_aux else None  # local learning trains from auxiliary heads
    model = build_model(arch, num_classes=num_classes, stem=stem, width=width, aux_head=aux)
    gen = torch.Generator().manual_seed(seed)
    batches = [
        (
            torch.randn(batch, 3, image_size, image_size, generator=gen),
            torch.randint(0, num_classes, (batch,), generator=gen),
        )
        for _ in range(num_batches)
    ]
    sim = Simulator(model, method, num_batches=num_batches, get_batch=batches.__getitem__, batch_size=batch, k=k)
    rec = Recorder(sim, flops_minibatches=flops_minibatches, walk_held=walk_held)
    sim.run()
    rec.detach()
    return rec


def steady_phases(phases: pd.DataFrame, num_batches: int) -> pd.DataFrame:
    """The phase rows to time: the second half of the minibatches, none FLOP-counted.

    While a pipeline fills, every stage's kept memory grows, and on CPU each new allocation costs
    page faults: delayed gradients' first stage ran its forward 7x slower during the fill than
    after it (RevNet18 at 224², J = 10). The median of the second half is the steady state the
    paper's time column describes; with fewer minibatches the rows not FLOP-counted are used.
    """
    untimed = phases.flops_counted | (phases.mb < num_batches // 2)
    for keep in (~untimed, ~phases.flops_counted):
        if keep.any():
            return phases[keep]
    return phases


def resnet_messages(arch: str, *, stem: str, image_size: int, batch: int, width: int, num_classes: int) -> pd.DataFrame:
    """Backprop message payloads of the ResNet with the RevNet's stream width, by shape propagation."""
    with torch.device("meta"):
        resnet = build_model(arch.replace("revnet", "resnet"), num_classes=num_classes, stem=stem, width=width)
    rows = stage_shapes(resnet, batch=batch, image_size=image_size)
    J = len(rows)
    return pd.DataFrame(
        [
            dict(
                stage=r["stage"],
                resnet_fwd_bytes=FLOAT32 * r["output_numel"] if r["stage"] < J - 1 else 0,
                resnet_bwd_bytes=FLOAT32 * r["input_numel"] if r["stage"] > 0 else 0,
            )
            for r in rows
        ]
    )


def per_stage(
    arch: str,
    *,
    methods=tuple(METHODS),
    stem: str = "imagenet",
    image_size: int = 224,
    batch: int = 2,
    num_batches: int = 3,
    width: int = 64,
    num_classes: int = 1000,
    k: int = 1,
    seed: int = 0,
) -> pd.DataFrame:
    """One tidy row per (method, stage): bytes, messages, FLOPs and times (see the module docstring)."""
    if "backprop" not in methods:
        raise ValueError("per_stage needs 'backprop' among the methods: it is the unit of FLOPs, time and messages")
    cfg = dict(stem=stem, image_size=image_size, batch=batch, width=width, num_classes=num_classes)
    with torch.device("meta"):
        shapes = pd.DataFrame(
            stage_shapes(
                build_model(arch, num_classes=num_classes, stem=stem, width=width), batch=batch, image_size=image_size
            )
        )
    J = len(shapes)
    out = []
    for method in methods:
        m = get_method(method)
        rec = run_method(arch, method, num_batches=num_batches, k=k, seed=seed, **cfg)
        f = rec.frames()
        ph, msg, kept = f["phases"], f["messages"], f["kept"]
        flops = ph[ph.flops_counted].pivot_table(index="stage", columns="phase", values="flops", aggfunc="mean")
        timed = steady_phases(ph, num_batches)
        secs = timed.pivot_table(index="stage", columns="phase", values="seconds", aggfunc="median")
        first = kept[kept.in_flight == 1].groupby(["stage", "buffer"]).held_bytes.first().unstack(fill_value=0)
        sent = msg.groupby(["stage", "direction"]).payload_bytes.mean().unstack(fill_value=0)
        received = msg[msg.direction == "backward"].groupby("receiver").payload_bytes.mean()
        schedule = m.schedule(J, num_batches, k=k)
        for j, s in shapes.iterrows():
            stale, n = schedule.staleness(j), schedule.in_flight(j)
            row = dict(
                arch=arch,
                method=method,
                schedule=schedule.name,
                stage=j,
                kind=s.kind,
                J=J,
                staleness=stale,
                in_flight=n,
                batch=batch,
                image_size=image_size,
                width=width,
                k=k,
                input_bytes=FLOAT32 * s.input_numel,
                param_bytes=FLOAT32 * s.params,
            )
            for buf in ("input", "graph", "weight_stash"):
                row[f"{buf}_bytes_per_mb"] = int(first.at[j, buf]) if j in first.index and buf in first else 0
            row["kept_bytes"] = n * (row["input_bytes_per_mb"] + row["graph_bytes_per_mb"])
            row["stash_bytes"] = math.ceil(stale / k) * row["weight_stash_bytes_per_mb"]
            row["activations_units"] = row["kept_bytes"] / row["input_bytes"]
            row["params_units"] = 1 + row["stash_bytes"] / row["param_bytes"]
            for phase in ("forward", "rebuild", "backward"):
                row[f"{phase}_flops"] = float(flops.at[j, phase]) if phase in flops else 0.0
                row[f"{phase}_seconds"] = float(secs.at[j, phase]) if phase in secs else 0.0
            row["fwd_sent_bytes"] = float(sent.at[j, "forward"]) if "forward" in sent and j in sent.index else 0.0
            row["bwd_sent_bytes"] = float(sent.at[j, "backward"]) if "backward" in sent and j in sent.index else 0.0
            row["bwd_received_bytes"] = float(received.get(j, 0.0))
            out.append(row)
    df = pd.DataFrame(out).merge(resnet_messages(arch, **cfg), on="stage")
    bp = df[df.method == "backprop"].set_index("stage") if "backprop" in methods else None
    for col, ref in (("fwd_sent", "resnet_fwd_bytes"), ("bwd_sent", "resnet_bwd_bytes"), ("bwd_received", None)):
        ref_bytes = (
            df[ref] if ref else df.stage.map(lambda j: df.resnet_bwd_bytes[df.stage == j + 1].max() if j + 1 < J else 0)
        )
        df[f"{col}_vs_resnet"] = df[f"{col}_bytes"] / ref_bytes.where(ref_bytes > 0)
        if bp is not None:
            same = df.stage.map(bp[f"{col}_bytes"])
            df[f"{col}_vs_backprop"] = df[f"{col}_bytes"] / same.where(same > 0)
    if bp is not None:
        df["bp_forward_flops"] = df.stage.map(bp.forward_flops)
        df["bp_forward_seconds"] = df.stage.map(bp.forward_seconds)
    return df


def representative_stage(df: pd.DataFrame) -> int:
    """The first reversible stage whose predecessor is reversible too (sends and receives ×4 under PETRA)."""
    kinds = df.drop_duplicates("stage").sort_values("stage").kind.tolist()
    return next(j for j in range(1, len(kinds)) if kinds[j] == "R" and kinds[j - 1] == "R")


def network_costs(df: pd.DataFrame) -> pd.DataFrame:
    """Per method: FLOPs and time per minibatch for the whole network, in mean backprop stage forwards.

    time_serial: sequential methods sum every stage's forward + rebuild + backward; pipelined
    methods take the slowest stage's tick with its phases one after another (as a worker runs
    them). time_parallel: the same with forward and rebuild + backward in parallel (the paper's
    assumption). time_balanced: pipelined, parallel, with the work spread evenly over the stages
    (the paper's ideal setting): sum_j max(f_j, r_j + b_j) / sum_j f_j of backprop.
    """
    rows = []
    for method, g in df.groupby("method", sort=False):
        J = g.J.iloc[0]
        unit_flops, unit_secs = g.bp_forward_flops.sum() / J, g.bp_forward_seconds.sum() / J
        work = g.forward_seconds + g.rebuild_seconds + g.backward_seconds
        parallel = pd.concat([g.forward_seconds, g.rebuild_seconds + g.backward_seconds], axis=1).max(axis=1)
        flops = (g.forward_flops + g.rebuild_flops + g.backward_flops).sum()
        seq = get_method(method).schedule.one_in_flight
        rows.append(
            dict(
                arch=g.arch.iloc[0],
                method=method,
                J=J,
                flops=flops,
                flops_units=flops / unit_flops,
                time_serial_s=work.sum() if seq else work.max(),
                time_parallel_s=work.sum() if seq else parallel.max(),
                time_unit_s=unit_secs,
                time_balanced_units=(work.sum() if seq else parallel.sum() / J) / unit_secs,
            )
        )
    out = pd.DataFrame(rows)
    out["time_serial_units"] = out.time_serial_s / out.time_unit_s
    out["time_parallel_units"] = out.time_parallel_s / out.time_unit_s
    return out


def table1(df: pd.DataFrame, stage: int | None = None) -> list[dict]:
    """Tidy rows (arch, method, quantity, paper, measured, ...) of Table 1 at one stage (0-based)."""
    ref = load_reference("paper_table1")
    stage = representative_stage(df) if stage is None else stage
    net = network_costs(df).set_index("method")
    at = df[df.stage == stage].set_index("method")
    J, j = int(at.J.iloc[0]), stage + 1
    k = int(at.k.iloc[0])
    FG = float(at.loc["backprop", "activations_units"]) if "backprop" in at.index else float("nan")
    rows = []
    for method, r in at.iterrows():
        paper = ref["methods"].get(method)  # None: a method the paper does not have (local learning)
        names = dict(J=J, j=j, k=k, FG=FG)
        measured = dict(
            activations=r.activations_units,
            params=r.params_units,
            comm=r.bwd_received_vs_resnet,
            flops=net.at[method, "flops_units"],
            time=net.at[method, "time_serial_units"],
        )
        extra = dict(
            activations="",
            params="",
            comm=f"fwd×{r.fwd_sent_vs_resnet:.2f} bwd-sent×{r.bwd_sent_vs_resnet:.2f} "
            f"(vs same-net backprop: fwd×{r.get('fwd_sent_vs_backprop', float('nan')):.2f} "
            f"bwd-recv×{r.get('bwd_received_vs_backprop', float('nan')):.2f})",
            flops="",
            time=f"fwd∥bwd {net.at[method, 'time_parallel_units']:.2f}, "
            f"balanced fwd∥bwd {net.at[method, 'time_balanced_units']:.2f}",
        )
        for q in ("activations", "params", "comm", "flops", "time"):
            rows.append(
                dict(
                    arch=r.arch,
                    method=method,
                    label=paper["label"] if paper else method,
                    stage=stage,
                    J=J,
                    j=j,
                    quantity=q,
                    paper_expr=str(paper[q]) if paper else "",
                    paper=evaluate_formula(paper[q], **names) if paper else float("nan"),
                    measured=float(measured[q]),
                    note=extra[q],
                )
            )
    return rows
