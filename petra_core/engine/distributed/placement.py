"""Where this rank sits in the device mesh (:class:`RankPlacement`), and how failures name it and
its peers: by mesh coordinate and stages (``rank 3 (replica 1, stages 5-9)``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..placement import format_stages
from ..worlds import Mesh


class RankPlacement:
    """Cell (``replica``, ``position``) of ``mesh``, this rank's; every stage of it on ``device``."""

    def __init__(self, mesh: Mesh, rank: int, device: torch.device):
        self.mesh, self.rank, self.device = mesh, rank, torch.device(device)
        self.world_size = mesh.size
        self.replica, self.position = mesh.coordinate(rank)
        self.replicas = range(self.replica, self.replica + 1)
        self.is_main = rank == 0
        self.ranges: list[range] = []

    def connect(self, ranges: Sequence[range]) -> None:
        self.ranges = list(ranges)

    @property
    def stages(self) -> range:
        return self.ranges[self.position]

    def device_for(self, stage: int) -> torch.device:
        return self.device

    def describe(self) -> str:
        return self.name_rank(self.rank)

    def name_rank(self, rank: int) -> str:
        """``rank 3 (replica 1, stages 5-9)``; without replicas ``rank 1 (stages 5-9)``."""
        replica, position = self.mesh.coordinate(rank)
        where = [f"replica {replica}"] if self.mesh.replicas > 1 else []
        if self.ranges:
            where.append(format_stages(self.ranges[position]))
        return f"rank {rank}" + (f" ({', '.join(where)})" if where else "")

    def name_stage(self, stage: int, position: int) -> str:
        """``stage 7 of replica 1 (rank 3)``; without replicas ``stage 7 (rank 1)``."""
        of = f" of replica {self.replica}" if self.mesh.replicas > 1 else ""
        return f"stage {stage}{of} (rank {self.mesh.rank(self.replica, position)})"
