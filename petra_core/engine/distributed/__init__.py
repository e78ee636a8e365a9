"""The distributed runtime: the same stage workers and runner as the simulator, one process per rank.

``world`` (:class:`DistributedWorld`: this rank's composition of the parts below), ``placement``
(:class:`RankPlacement`: this rank's cell of the mesh), ``transport`` (stage messages point to
point), ``wire`` (their format), ``replica_group`` (the replica axis), ``ranks``
(:class:`DistributedRanks`: the clock, the run's collectives, failure reports), ``failures``
(:class:`PipelineError`, the shared failure key, heartbeats). A rank's pipeline is the one runner
built in its world, ``Pipeline.build(PipelineSpec(world=DistributedWorld(...), ...))``. Processes
are started and joined by ``petra_core.engine.launch``; ``petra train ... runtime=distributed`` under torchrun is the
training entry point. See docs/distributed.md.
"""

from .failures import DEFAULT_TIMEOUT, FAILURE_KEY, FailureWatch, PipelineError
from .placement import RankPlacement
from .ranks import DistributedRanks
from .replica_group import DistributedReplicaGroup
from .transport import DistributedTransport, TransportStats
from .world import DistributedWorld, model_fingerprint

__all__ = [
    "DEFAULT_TIMEOUT",
    "FAILURE_KEY",
    "DistributedRanks",
    "DistributedReplicaGroup",
    "DistributedTransport",
    "DistributedWorld",
    "FailureWatch",
    "PipelineError",
    "RankPlacement",
    "TransportStats",
    "model_fingerprint",
]
