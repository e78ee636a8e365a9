"""ACCO's timing mode, and the synchronous baselines it is timed against, on the ranks of a
data-parallel run (each rank holds a whole model; P = 1).

The replica rules of ``acco.py`` accumulate a fixed count of micro-batches per round, so runs are
deterministic. ACCO as published accumulates *until the communication is done*: each rank goes
on computing micro-batches (at least ``n``) while its round of communication runs on another
thread, so a slow link or a slow peer costs it no idle time, and the count of each rank enters
the mean (count-weighted). This module runs that loop, and DDP (all-reduce, then the step) and
ZeRO-1 (reduce-scatter, the shard's step, all-gather) beside it, timing every step:
``benchmarks/bench_acco.py`` launches it on gloo ranks.

* :class:`Link` emulates a slow link: every collective is held back by the bytes it moves on the
  wire of a ring (a reduce-scatter or an all-gather (R − 1)/R of the vector per rank, an
  all-reduce twice that) ÷ the bandwidth, slept on the thread that called it.
* ``slow``: a rank that sleeps ``slow`` × its compute time after each micro-batch (a worker
  1 + ``slow`` times slower, as the paper emulates heterogeneous workers with sleeps).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from .rule import set_grads
from .sharded import FlatLayout, ShardedOptimizer

METHODS = ("ddp", "zero1", "acco")


@dataclass(frozen=True)
class Link:
    """An emulated link of ``gbit_s`` gigabits per second (None: the real one, loopback)."""

    gbit_s: float | None = None

    def delay(self, floats: int, replicas: int, kind: str, element_size: int = 4) -> float:
        if self.gbit_s is None or replicas == 1:
            return 0.0
        share = (replicas - 1) / replicas * (2 if kind == "all_reduce" else 1)
        return floats * element_size * share * 8 / (self.gbit_s * 1e9)


class Collectives:
    """The blocking collectives of ``group`` (the replicas' process group, which its launcher creates
    and owns: ``benchmarks/bench_acco.py`` passes the whole world), slowed by ``link``."""

    def __init__(self, group, link: Link = Link()):
        self.link, self.group = link, group
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)

    def _slow(self, floats: int, kind: str) -> None:
        pause = self.link.delay(floats, self.size, kind)
        if pause:
            time.sleep(pause)

    def all_reduce_sum(self, t: Tensor) -> Tensor:
        dist.all_reduce(t, group=self.group)
        self._slow(t.numel(), "all_reduce")
        return t

    def reduce_scatter_sum(self, flat: Tensor) -> Tensor:
        out = torch.empty(flat.numel() // self.size, dtype=flat.dtype)
        dist.reduce_scatter_tensor(out, flat, group=self.group)
        self._slow(flat.numel(), "reduce_scatter")
        return out

    def all_gather(self, shard: Tensor) -> Tensor:
        out = torch.empty(shard.numel() * self.size, dtype=shard.dtype)
        dist.all_gather_into_tensor(out, shard.contiguous(), group=self.group)
        self._slow(out.numel(), "all_gather")
        return out


class Worker:
    """This rank's model, its optimizer (unsharded, for DDP) and its shard (ZeRO-1, ACCO), and its
    stream of micro-batches."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        get_batch: Callable[[int], tuple],
        replicas: int,
        rank: int,
        slow: float = 0.0,
    ):
        self.model, self.optimizer, self.get_batch = model, optimizer, get_batch
        self.layout = FlatLayout(optimizer, replicas)
        self.shard = ShardedOptimizer(optimizer, self.layout, rank)
        self.rank, self.replicas, self.slow = rank, replicas, slow
        self.mb = 0  # micro-batches computed: this rank's i-th is micro-batch i * R + rank of the stream

    def micro_batch(self) -> float:
        """Forward and backward of the next micro-batch, its gradient added (unscaled: a sum) to the
        parameters'; the seconds it took, a slow worker's sleep (``slow`` times as long) included."""
        t0 = time.perf_counter()
        x, y = self.get_batch(self.mb * self.replicas + self.rank)
        F.cross_entropy(self.model(x), y).backward()
        self.mb += 1
        if self.slow:
            time.sleep(self.slow * (time.perf_counter() - t0))
        return time.perf_counter() - t0

    def compute(self, at_least: int, until: Future | None = None) -> tuple[int, float]:
        """At least ``at_least`` micro-batches, and more until ``until`` is done: (count, seconds)."""
        count, seconds = 0, 0.0
        while count < at_least or (until is not None and not until.done()):
            seconds += self.micro_batch()
            count += 1
        return count, seconds

    def lrs(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def zero_grad(self) -> None:
        for p in self.layout.params:
            p.grad = None


def _record(t0: float, compute: float, comm: float, micro: int) -> dict:
    return {"step_s": time.perf_counter() - t0, "compute_s": compute, "comm_s": comm, "micro_batches": micro}


def run_ddp(w: Worker, coll: Collectives, steps: int, n: int) -> list[dict]:
    """DDP: 2n micro-batches, the gradient all-reduced, the unsharded optimizer steps."""
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        count, compute = w.compute(2 * n)
        c0 = time.perf_counter()
        flat = coll.all_reduce_sum(w.layout.grads()) / (coll.size * count)
        comm = time.perf_counter() - c0
        set_grads(w.layout.params, flat)
        w.optimizer.step()
        w.zero_grad()
        out.append(_record(t0, compute, comm, count))
    return out


def sharded_round(w: Worker, coll: Collectives, grad_sum: Tensor, count: int, tentative: bool) -> tuple[Tensor, float]:
    """One round: the total count all-reduced, the gradient sum reduce-scattered and divided by it,
    the shard's step (undone if ``tentative``), the parameters all-gathered: (flat weights, seconds)."""
    t0 = time.perf_counter()
    total = coll.all_reduce_sum(torch.tensor([float(count)], dtype=grad_sum.dtype))
    grad = coll.reduce_scatter_sum(grad_sum) / total
    before = w.shard.snapshot() if tentative else None
    shard = w.shard.step(grad, w.lrs())
    if before is not None:
        w.shard.restore(before)
    return coll.all_gather(shard), time.perf_counter() - t0


def run_zero1(w: Worker, coll: Collectives, steps: int, n: int) -> list[dict]:
    """ZeRO-1: 2n micro-batches, then one round, waited for."""
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        count, compute = w.compute(2 * n)
        flat, comm = sharded_round(w, coll, w.layout.grads(), count, tentative=False)
        w.layout.load(flat)
        w.zero_grad()
        out.append(_record(t0, compute, comm, count))
    return out


def run_acco(w: Worker, coll: Collectives, steps: int, n: int) -> list[dict]:
    """ACCO, timing mode: rounds alternate tentative and real on a communication thread while this
    rank computes at least ``n`` micro-batches, and more until the round is done. The gradient
    buffer accumulates over the two halves of a step (the real round sends both, count-weighted)
    and is emptied after the real round is asked for."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="acco-rounds")
    out = []
    try:
        theta = w.layout.values()
        count1, compute1 = w.compute(n)  # the first half of step 0, at θ̃_0 = θ_0: nothing to wait for
        pending = pool.submit(sharded_round, w, coll, w.layout.grads(), count1, True)
        for t in range(steps):
            t0 = time.perf_counter()
            count2, compute2 = w.compute(n, until=pending)  # the second half, at θ_t
            tilde, comm1 = pending.result()
            pending = pool.submit(sharded_round, w, coll, w.layout.grads(), count1 + count2, False)
            w.zero_grad()
            w.layout.load(tilde)  # the next first half, at θ̃_{t+1}, during the real round
            count1, compute1b = w.compute(n, until=pending)
            theta, comm2 = pending.result()
            w.layout.load(theta)
            if t + 1 < steps:
                pending = pool.submit(sharded_round, w, coll, w.layout.grads(), count1, True)
            out.append(_record(t0, compute2 + compute1b, comm1 + comm2, count2 + count1))
    finally:
        pool.shutdown(wait=True)
    return out


RUNNERS = {"ddp": run_ddp, "zero1": run_zero1, "acco": run_acco}
