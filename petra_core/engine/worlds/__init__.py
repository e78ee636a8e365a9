"""Worlds by composition: the parts a :class:`World` is made of, each with its own contract.

``mesh`` (:class:`Mesh`: replicas × pipeline positions), ``placement`` (where this process sits
and its stages' devices), ``transport`` (stage messages within a replica), ``replica_groups``
(where a stage's copies meet), ``ranks`` (tick boundaries, the run's collectives, failures), and
``world`` (:class:`World`, and :class:`LocalWorld`: every cell in one process). The distributed
parts and their composition live in ``petra_core.engine.distributed``.
"""

from .mesh import Mesh
from .placement import LocalPlacement, Placement
from .ranks import LocalRanks, Ranks
from .replica_groups import LocalReplicaGroup, OneGroup, ReplicaGroups
from .transport import LocalTransport, Transport
from .world import LocalWorld, World

__all__ = [
    "LocalPlacement",
    "LocalRanks",
    "LocalReplicaGroup",
    "LocalTransport",
    "LocalWorld",
    "Mesh",
    "OneGroup",
    "Placement",
    "Ranks",
    "ReplicaGroups",
    "Transport",
    "World",
]
