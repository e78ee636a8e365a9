"""The mesh of a run: R replicas × P pipeline positions, and the rank of each cell."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Mesh:
    """R replicas × P pipeline positions; rank ``replica * positions + position`` (row-major, as
    ``torch.distributed.device_mesh.init_device_mesh`` with dims ("replica", "pipeline"))."""

    replicas: int = 1
    positions: int = 1

    @property
    def size(self) -> int:
        return self.replicas * self.positions

    def rank(self, replica: int, position: int) -> int:
        return replica * self.positions + position

    def coordinate(self, rank: int) -> tuple[int, int]:
        """(replica, position) of ``rank``."""
        return divmod(rank, self.positions)

    def __str__(self) -> str:
        return f"{self.replicas}x{self.positions}"
