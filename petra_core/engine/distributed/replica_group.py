"""The copies of this rank's stages across replicas (:class:`DistributedReplicaGroup`): the
replica axis of the device mesh, whose collectives run while the rank computes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.distributed as dist


class DistributedReplicaGroup:
    """The R copies of this rank's stages, one per replica: the replica axis of the device mesh. Its
    collectives run while the rank computes (``overlaps``: the runner completes them late).
    ``collective(what, fn)`` runs ``fn`` and names the rank that is gone if it breaks. ``issue``: the
    lock every NCCL operation of this rank is posted under (the world's; the transport's receiver
    threads post under it too), so no two threads issue NCCL calls at once."""

    overlaps, local = True, 1

    def __init__(self, group, size: int, collective: Callable, issue=None):
        self.group, self.size, self.collective = group, size, collective
        self.issue = issue if issue is not None else contextlib.nullcontext()
        self.floats_sent = 0  # what this rank has put into the replica axis' collectives

    def _post(self, what: str, op: Callable):
        """``op()`` (an async collective) posted under the issue lock; its work handle."""

        def posted():
            with self.issue:
                return op()

        return self.collective(what, posted)

    def all_reduce_mean(self, tensors: list) -> Callable[[], None]:
        (t,) = tensors
        self.floats_sent += t.numel()
        work = self._post(
            "averaging with the other replicas", lambda: dist.all_reduce(t, group=self.group, async_op=True)
        )

        def wait() -> None:
            self.collective("averaging with the other replicas", work.wait)
            t.div_(self.size)

        return wait

    def reduce_scatter_mean(self, tensors: list) -> Callable[[], list]:
        (t,) = tensors
        self.floats_sent += t.numel()
        out = torch.empty(t.numel() // self.size, dtype=t.dtype, device=t.device)
        work = self._post(
            "averaging with the other replicas",
            lambda: dist.reduce_scatter_tensor(out, t.contiguous(), group=self.group, async_op=True),
        )

        def wait() -> list:
            self.collective("averaging with the other replicas", work.wait)
            return [out.div_(self.size)]

        return wait

    def all_gather(self, tensors: list) -> Callable:
        (t,) = tensors
        self.floats_sent += t.numel()
        outs = [torch.empty_like(t) for _ in range(self.size)]
        work = self._post(
            "gathering from the other replicas",
            lambda: dist.all_gather(outs, t.contiguous(), group=self.group, async_op=True),
        )

        def wait():
            self.collective("gathering from the other replicas", work.wait)
            return torch.stack(outs)

        return wait
