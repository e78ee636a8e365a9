"""Where the copies of a stage meet (:class:`ReplicaGroups`), and the in-process group of them
(:class:`LocalReplicaGroup`): their mean, summed in replica order, at once.

A replica rule only ever sees a :class:`~petra_core.replicas.ReplicaGroup`; the world's
``groups`` part says which one serves each stage. Every stage of a process meets its copies in
the same group (:class:`OneGroup`): the replica axis of the mesh.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor


class ReplicaGroups(Protocol):
    def replica_group(self, stage: int):
        """The :class:`~petra_core.replicas.ReplicaGroup` of ``stage``'s copies."""
        ...


class OneGroup:
    """Every stage of this process meets its copies in ``group``."""

    def __init__(self, group):
        self.group = group

    def replica_group(self, stage: int):
        return self.group


class LocalReplicaGroup:
    """The R copies of a stage, all in this process: their mean, summed in replica order, at once.
    ``floats_sent``: the floats each replica has put into collectives (what a rank would send)."""

    overlaps = False

    def __init__(self, size: int):
        self.size = self.local = size
        self.floats_sent = 0

    def _check(self, tensors: list[Tensor]) -> None:
        if len(tensors) != self.size:
            raise RuntimeError(f"a local replica group of {self.size} got {len(tensors)} tensors")

    def _mean(self, tensors: list[Tensor]) -> Tensor:
        self._check(tensors)
        self.floats_sent += tensors[0].numel()
        total = tensors[0].clone()
        for t in tensors[1:]:
            total += t
        return total.div_(self.size)

    def all_reduce_mean(self, tensors: list[Tensor]) -> Callable[[], None]:
        total = self._mean(tensors)
        for t in tensors:
            t.copy_(total)
        return lambda: None

    def reduce_scatter_mean(self, tensors: list[Tensor]) -> Callable[[], list[Tensor]]:
        """The mean of flat R·S floats (as :meth:`all_reduce_mean`); copy r gets slice r of it."""
        shards = list(self._mean(tensors).view(self.size, -1))
        return lambda: shards

    def all_gather(self, tensors: list[Tensor]) -> Callable[[], Tensor]:
        """Every copy's tensor (all of one shape), stacked in replica order: (R, *shape)."""
        self._check(tensors)
        self.floats_sent += tensors[0].numel()
        stacked = torch.stack(tensors)
        return lambda: stacked
