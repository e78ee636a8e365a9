"""The copies of this rank's stages across replicas (:class:`DistributedReplicaGroup`): the
replica axis of the device mesh, whose collectives run while the rank computes."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from ..emulation import Link, RingDelay


class DistributedReplicaGroup:
    """The R copies of this rank's stages, one per replica: the replica axis of the device mesh. Its
    collectives run while the rank computes (``overlaps``: the runner completes them late).
    ``collective(what, fn)`` runs ``fn`` and names the rank that is gone if it breaks. ``issue``: the
    lock every NCCL operation of this rank is posted under (the world's; the transport's receiver
    threads post under it too), so no two threads issue NCCL calls at once. ``link``: an emulated
    link (``engine/emulation.py``): each collective completes no sooner than a ring over it would."""

    overlaps, local = True, 1

    def __init__(self, group, size: int, collective: Callable, issue=None, link: Link | None = None):
        self.group, self.size, self.collective = group, size, collective
        self.issue = issue if issue is not None else contextlib.nullcontext()
        self.ring = RingDelay(link, size) if link is not None else None
        self.floats_sent = 0  # what this rank has put into the replica axis' collectives
        self.wait_s = 0.0  # seconds this rank's main thread spent blocked on them

    def _post(self, what: str, op: Callable, kind: str, nbytes: int):
        """``op()`` (an async collective) posted under the issue lock; its work handle and when an
        emulated ring would finish it (None: no emulation). ``nbytes``: the whole tensor's (the
        gathered one for an all-gather)."""

        def posted():
            with self.issue:
                return op()

        due = self.ring.due(time.monotonic(), kind, nbytes) if self.ring else None
        return self.collective(what, posted), due

    def _wait(self, what: str, work, due: float | None) -> None:
        t0 = time.perf_counter()
        self.collective(what, work.wait)
        if due is not None:
            self.ring.hold(due)
        self.wait_s += time.perf_counter() - t0

    def all_reduce_mean(self, tensors: list) -> Callable[[], None]:
        (t,) = tensors
        self.floats_sent += t.numel()
        work, due = self._post(
            "averaging with the other replicas",
            lambda: dist.all_reduce(t, group=self.group, async_op=True),
            "all_reduce",
            t.numel() * t.element_size(),
        )

        def wait() -> None:
            self._wait("averaging with the other replicas", work, due)
            t.div_(self.size)

        return wait

    def reduce_scatter_mean(self, tensors: list) -> Callable[[], list]:
        (t,) = tensors
        self.floats_sent += t.numel()
        out = torch.empty(t.numel() // self.size, dtype=t.dtype, device=t.device)
        work, due = self._post(
            "averaging with the other replicas",
            lambda: dist.reduce_scatter_tensor(out, t.contiguous(), group=self.group, async_op=True),
            "reduce_scatter",
            t.numel() * t.element_size(),
        )

        def wait() -> list:
            self._wait("averaging with the other replicas", work, due)
            return [out.div_(self.size)]

        return wait

    def all_gather(self, tensors: list) -> Callable:
        (t,) = tensors
        self.floats_sent += t.numel()
        outs = [torch.empty_like(t) for _ in range(self.size)]
        work, due = self._post(
            "gathering from the other replicas",
            lambda: dist.all_gather(outs, t.contiguous(), group=self.group, async_op=True),
            "all_gather",
            t.numel() * t.element_size() * self.size,
        )

        def wait():
            self._wait("gathering from the other replicas", work, due)
            return torch.stack(outs)

        return wait
