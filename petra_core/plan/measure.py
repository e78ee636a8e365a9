"""One real, emulated point of a pipeline: what ``petra plan validate`` checks its predictions against.

:func:`measure_point` starts J × R local gloo ranks (one stage per rank, the replicas × positions
mesh), trains a chain model of J stages on random data with the point's method, and returns what
the run measured. With ``phase_seconds`` each compute phase is padded to its target and with
``link`` each message crosses an emulated link (``petra_core/engine/emulation.py``), so the run
is timed as on J × R devices joined by that link whatever the cores of this machine.

The model is a chain of J stages from RevNet18's parts at width ``width``: the CIFAR stem, J − 2
reversible blocks, the head (J ≥ 2), so any J is one stage per rank and every method applies.

Steady state: the time per minibatch is measured on rank 0 (replica 0's stage 0) between the
completion of two minibatches' gradients at stage 0, leaving out ``w`` minibatches at each end
(w = J rounded up to whole flush groups for GPipe, 1F1B and backprop), so the pipeline's fill and
drain are outside the window.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, field

from .chain import IMAGE_SIZE, chain_model

RANK_PROGRAM = "petra_core.plan.measure"  # python -m RANK_PROGRAM --point JSON --out FILE


@dataclass(frozen=True)
class EmulatedPoint:
    """A point to run: method, J stages (= ranks per replica), R replicas, batch, k, the chain's
    width, the minibatches per replica, and the emulation (None: real compute, no link delay)."""

    method: str
    stages: int
    replicas: int = 1
    batch: int = 8
    k: int = 1
    arch: str = "revnet18"
    width: int = 4
    minibatches: int = 40
    phase_seconds: dict[str, list[float]] | None = field(default=None, hash=False)
    link: tuple[float, float] | None = None  # (latency s, bandwidth bytes/s)

    def __post_init__(self):
        from ..methods import METHODS

        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r} is not allowed; allowed: {', '.join(METHODS)}")
        for name, least in (("stages", 2), ("replicas", 1), ("batch", 1), ("k", 1), ("width", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name}={value!r} is not allowed; allowed: an integer >= {least}")
        method = METHODS[self.method]
        if method.needs_aux:
            raise ValueError(f"method={self.method!r} is not allowed; the chain has no auxiliary heads")
        if method.needs_reversible and self.stages < 3:
            raise ValueError(
                f"stages={self.stages!r} is not allowed for {self.method}: the chain's reversible blocks are "
                f"stages 1..J-2, so it needs stages >= 3"
            )
        if self.arch != "revnet18":
            raise ValueError(f"arch={self.arch!r} is not allowed; allowed: revnet18 (its parts make the chain)")
        w = steady_margin(self)
        if self.minibatches < 2 * w + 2:
            raise ValueError(
                f"minibatches={self.minibatches!r} leaves no steady window; allowed: >= {2 * w + 2} "
                f"({w} left out at each end)"
            )


def steady_margin(point: EmulatedPoint) -> int:
    """Minibatches left out at each end of the timed window: J, rounded up to whole flush groups."""
    from ..engine.spec import schedule_for
    from ..methods import get_method

    schedule = schedule_for(get_method(point.method), point.stages, max(point.minibatches, 1), point.k)
    group = getattr(schedule, "group_size", 1) if schedule.fixed_weights_in_flight else 1
    return -(-point.stages // group) * group


def measure_point(point: EmulatedPoint, *, timeout: float = 600.0) -> dict:
    """Run ``point`` on J × R local ranks and return what it measured:

    ``seconds_per_minibatch`` (steady state, per replica's minibatch), ``phase_seconds`` (measured
    mean per phase and stage, padding included), ``host_seconds`` (per stage, the engine's own
    seconds per tick it acts in: the rank's tick time outside its phases, less the time it was
    blocked on a message, an earlier send or a replica collective, ``blocked_seconds`` per rank),
    ``message_delays`` (:func:`message_delays`), ``message_bytes`` (``{"forward": [...],
    "backward": [...]}``: what each stage sent to the next and to the previous one, per
    minibatch), ``peak_bytes`` (None: no allocator peak per rank on CPU), ``kept_bytes`` (the most
    activation bytes each rank kept between a forward and its backward), ``ranks``, ``padded_over`` (phases
    longer than their target), ``window`` (the minibatches timed), ``losses`` (the head's, by
    minibatch: the same with and without emulation)."""
    from ..engine.launch import launch_local

    ranks = point.stages * point.replicas
    with tempfile.TemporaryDirectory(prefix="petra-measure-") as tmp:
        out = os.path.join(tmp, "point.json")
        argv = ["--point", json.dumps(asdict(point)), "--out", out]
        procs = launch_local(argv, ranks, timeout=timeout, capture=True, module=RANK_PROGRAM)
        failed = [(r, p) for r, p in enumerate(procs) if p.returncode != 0]
        if failed:
            r, p = failed[0]
            tail = (p.err or "").strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"measuring {point.method} J={point.stages}: rank {r} exited {p.returncode}: {tail[0]}")
        with open(out) as f:
            return json.load(f)


# ---- the rank program ---------------------------------------------------------------------------
def _rank(point: EmulatedPoint, out: str) -> None:
    import torch

    from ..engine import Pipeline, PipelineSpec
    from ..engine.distributed import DistributedWorld
    from ..engine.emulation import Link, PhasePadding
    from ..engine.launch import init_distributed
    from ..optim import Recipe

    torch.set_num_threads(1)
    device = init_distributed("gloo")
    # no targets: pads nothing, still measures each phase (what a real point is predicted from)
    padding = PhasePadding(point.phase_seconds or {}, point.stages)
    world = DistributedWorld(device, replicas=point.replicas, link=Link(*point.link) if point.link else None)
    model = chain_model(point.stages, point.width)

    def get_batch(mb: int):
        g = torch.Generator().manual_seed(1_000_003 + mb)
        images = torch.randn(point.batch, 3, IMAGE_SIZE, IMAGE_SIZE, generator=g)
        return images, torch.randint(0, 10, (point.batch,), generator=g)

    pipe = Pipeline.build(
        PipelineSpec(
            model=model,
            method=point.method,
            recipe=Recipe(base_lr=0.01, scale_lr=False),
            num_batches=point.minibatches,
            k=point.k,
            world=world,
            get_batch=get_batch,
            batch_size=point.batch,
            observers=(padding,),
        )
    )
    pipe.world.transport.stats.clock = {}  # when each message was sent, arrived, asked for, taken
    while not pipe.done:
        pipe.advance()
    stats = pipe.world.transport.stats
    replica_wait = getattr(pipe.world.groups.replica_group(pipe.stages[0]), "wait_s", 0.0)
    mine = {
        "rank": pipe.rank,
        "stages": list(pipe.stages),
        "replica": pipe.world.placement.replica,
        "phases": padding.measured(),
        "overran": padding.overran,
        "bytes_sent": stats.bytes_sent,
        "bytes_sent_backward": stats.bytes_sent_backward,
        "peak_kept": sum(sum(w.peak_kept.values()) for w in pipe.workers),
        "tick_ends": list(pipe.tick_ends),
        # the main thread's seconds outside the phases and not blocked on a message or a collective
        "host_s": pipe.wall_s - sum(padding.total.values()) - stats.recv_wait_s - stats.send_wait_s - replica_wait,
        "clock": [[*key, t] for key, t in stats.clock.items()],
        "blocked_s": {"recv": stats.recv_wait_s, "send": stats.send_wait_s, "replicas": replica_wait},
        "losses": [(r.mb, r.loss) for r in pipe.head_log],
    }
    everyone = pipe.gather_object(mine)
    schedule = pipe.schedule
    pipe.close()
    if everyone is not None:
        from ..run.runio import write_json

        write_json(out, summarise(point, schedule, everyone))


def message_delays(ranks: list[dict]) -> dict:
    """The live link as the engine sees it, from replica 0's message clocks (one host: one monotonic
    clock): ``delivery_s``, the median from a message's send to all of it received (the receiver
    thread's); over the messages the main thread waited for (``waited``: how many), ``handoff_s``,
    the median from that to the main thread holding it, and ``latency_s``, from send to held: the
    one-way latency a message on the critical path pays; ``messages``, how many were timed."""
    import statistics

    clock = {tuple(key): t for r in ranks if r["replica"] == 0 for *key, t in r["clock"]}
    delivery, handoff, latency = [], [], []
    for (event, *message), sent in clock.items():
        arrived = clock.get(("arrived", *message))
        if event != "sent" or arrived is None:
            continue
        delivery.append(arrived - sent)
        asked, taken = clock.get(("asked", *message)), clock.get(("taken", *message))
        if asked is not None and taken is not None and asked < arrived:
            handoff.append(taken - arrived)
            latency.append(taken - sent)
    median = lambda xs: statistics.median(xs) if xs else 0.0  # noqa: E731
    return {
        "delivery_s": median(delivery), "handoff_s": median(handoff), "latency_s": median(latency),
        "messages": len(delivery), "waited": len(latency),
    }  # fmt: skip


def summarise(point: EmulatedPoint, schedule, ranks: list[dict]) -> dict:
    """The point's record from every rank's measurements (rank 0's clock times the window)."""
    n, w = point.minibatches, steady_margin(point)
    first, last = schedule.backward_tick(w - 1, 0), schedule.backward_tick(n - 1 - w, 0)
    zero = next(r for r in ranks if r["rank"] == 0)
    seconds = (zero["tick_ends"][last] - zero["tick_ends"][first]) / (n - 2 * w)
    phases: dict[str, list[float | None]] = {}
    for r in (r for r in ranks if r["replica"] == 0):
        for phase, per_stage in r["phases"].items():
            row = phases.setdefault(phase, [None] * point.stages)
            for stage, value in per_stage.items():
                row[int(stage)] = value
    acting = [sum(j in schedule.busy(t) for t in range(schedule.num_ticks)) for j in range(point.stages)]
    host = [0.0] * point.stages  # per tick the stage acts in, the mean over its replicas
    for r in ranks:
        host[r["stages"][0]] += r["host_s"] / acting[r["stages"][0]] / point.replicas
    message_bytes = {"forward": [0.0] * point.stages, "backward": [0.0] * point.stages}  # per sending stage
    by_rank = sorted(ranks, key=lambda r: r["rank"])
    for r in (r for r in ranks if r["replica"] == 0):
        j = r["stages"][0]
        message_bytes["backward"][j] = r["bytes_sent_backward"] / n
        message_bytes["forward"][j] = (r["bytes_sent"] - r["bytes_sent_backward"]) / n
    return {
        "point": asdict(point),
        "seconds_per_minibatch": seconds,
        "window": {"minibatches": n - 2 * w, "from_tick": first, "to_tick": last},
        "phase_seconds": phases,
        "host_seconds": host,
        "blocked_seconds": [r["blocked_s"] for r in by_rank],
        "message_bytes": message_bytes,
        "message_delays": message_delays(ranks),
        "peak_bytes": None,  # no allocator peak per rank on CPU (RSS holds torch itself): not compared
        "kept_bytes": [r["peak_kept"] for r in by_rank],
        "ranks": len(ranks),
        "losses": [loss for _, loss in sorted(x for r in ranks for x in r["losses"])],  # emulation changes none
        "padded_over": sum(r["overran"] for r in ranks),
        "total_seconds": max(r["tick_ends"][-1] for r in ranks) - min(r["tick_ends"][0] for r in ranks),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {RANK_PROGRAM}", description="one rank of an emulated point")
    p.add_argument("--point", required=True, type=json.loads)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    values = dict(args.point)
    if values.get("link") is not None:
        values["link"] = tuple(values["link"])
    _rank(EmulatedPoint(**values), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
