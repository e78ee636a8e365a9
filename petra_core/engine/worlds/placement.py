"""Where this process sits in the mesh (:class:`Placement`): its rank, its cells, its stages'
devices, and how failures name it. :class:`LocalPlacement` is the simulator's: one process holds
every cell, so it is rank 0 of a world of one and every replica is its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from .mesh import Mesh


class Placement(Protocol):
    """This process's cells of the mesh and its stages (``ranges`` is set by :meth:`connect`)."""

    mesh: Mesh
    rank: int  # this process in the whole world (0 in one process)
    world_size: int
    is_main: bool  # rank 0: evaluates, writes the run files, commits checkpoints
    position: int  # this process's pipeline position (stage 0 lives at position 0)
    replicas: range  # the replicas whose copies this process holds
    ranges: list[range]  # the stages of each pipeline position

    @property
    def stages(self) -> range:
        """The stages this process holds (in each of its replicas)."""
        ...

    def connect(self, ranges: Sequence[range]) -> None: ...
    def device_for(self, stage: int) -> torch.device | None: ...
    def describe(self) -> str: ...


class LocalPlacement:
    """Every cell in this process. ``devices``: where the stages go, in contiguous blocks (e.g. every
    visible GPU; each replica's copy of a stage goes to the same one); None leaves them where they are."""

    rank, world_size, is_main, position = 0, 1, True, 0

    def __init__(self, devices: Sequence[torch.device] | None = None, *, replicas: int = 1):
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise ValueError(f"replicas must be an integer >= 1, got {replicas!r}")
        self.devices = [torch.device(d) for d in devices] if devices else None
        self.mesh = Mesh(replicas, 1)
        self.replicas = range(replicas)
        self.ranges: list[range] = []

    def connect(self, ranges: Sequence[range]) -> None:
        self.ranges = list(ranges)

    @property
    def stages(self) -> range:
        return self.ranges[0]

    def device_for(self, stage: int) -> torch.device | None:
        """Where ``stage`` runs (None: where it already is)."""
        if self.devices is None:
            return None
        return self.devices[stage * len(self.devices) // len(self.stages)]

    def describe(self) -> str:
        return "this process"
