"""A world, composed of its parts (:class:`World`), and the world of one process (:class:`LocalWorld`).

A *world* is what a :class:`~petra_core.engine.pipeline.Pipeline` and the trainer need from the
processes around them, in four replaceable parts: ``placement`` (where this process sits in the
mesh of R replicas × P pipeline positions, and its stages' devices), ``transport`` (messages
between the stages of one replica), ``groups`` (where the copies of a stage meet, across
replicas) and ``ranks`` (tick boundaries, the run's collectives, failure reports). The world
itself only does what spans parts: connecting them to a placement, a tick's begin and end,
finishing, closing, and turning a failure into what every rank raises. :class:`LocalWorld` holds
every cell in one process (the simulator); ``DistributedWorld``, one cell per rank
(torch.distributed); they are two compositions, not parent and child.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from .placement import LocalPlacement, Placement
from .ranks import LocalRanks, Ranks
from .replica_groups import LocalReplicaGroup, OneGroup, ReplicaGroups
from .transport import LocalTransport, Transport


class World(Protocol):
    """The parts (see the module docstring) and what spans them."""

    placement: Placement
    transport: Transport
    groups: ReplicaGroups
    ranks: Ranks

    def connect(self, placement: Sequence[range], schedule, backward: bool = True) -> None:
        """Fix each pipeline position's stages and open the transport (``backward``: gradients flow back)."""
        ...

    def begin_tick(self, tick: int) -> None: ...
    def end_tick(self, tick: int) -> None: ...
    def finish(self) -> None: ...
    def close(self) -> None: ...
    def leave(self, ok: bool = True) -> None: ...
    def failure(self, err: BaseException, stage: int | None, tick: int) -> BaseException | None:
        """What to raise instead of ``err`` (None: ``err`` itself)."""
        ...


class LocalWorld:
    """Every cell of the mesh in this process: R replicas of every stage, messages in in-process
    FIFOs, the copies of a stage averaged at once. ``devices``: see :class:`LocalPlacement`."""

    def __init__(self, devices: Sequence[torch.device] | None = None, *, replicas: int = 1):
        self.placement = LocalPlacement(devices, replicas=replicas)
        self.transport = LocalTransport(self.placement)
        self.groups = OneGroup(LocalReplicaGroup(replicas))
        self.ranks = LocalRanks()

    def connect(self, placement: Sequence[range], schedule=None, backward: bool = True) -> None:
        self.placement.connect(placement)

    def begin_tick(self, tick: int) -> None:
        self.ranks.begin_tick(tick)
        self.transport.begin_tick(tick)

    def end_tick(self, tick: int) -> None:
        self.ranks.end_tick(tick)

    def finish(self) -> None:
        self.transport.finish()

    def close(self) -> None:
        self.ranks.close()
        self.transport.close()

    def leave(self, ok: bool = True) -> None:  # no process group to leave
        pass

    def failure(self, err: BaseException, stage: int | None, tick: int) -> BaseException | None:
        """None: ``err`` itself (no other rank needs telling)."""
        return None
