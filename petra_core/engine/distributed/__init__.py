"""The distributed runtime: the same stage workers and runner as the simulator, one process per rank.

``world`` (:class:`DistributedWorld`: this rank, its transport, the run's collectives, failure
reports), ``transport`` (stage messages point to point), ``wire`` (their format), ``failures``
(:class:`PipelineError`, the shared failure key, heartbeats). A rank's pipeline is the one runner
built in its world, ``Pipeline.build(PipelineSpec(world=DistributedWorld(...), ...))``. Processes
are started and joined by ``petra_core.engine.launch``; ``petra train ... runtime=distributed`` under torchrun is the
training entry point. See docs/distributed.md.
"""

from .failures import DEFAULT_TIMEOUT, FAILURE_KEY, FailureWatch, PipelineError
from .transport import DistributedTransport, TransportStats
from .world import DistributedWorld, model_fingerprint

__all__ = [
    "DEFAULT_TIMEOUT",
    "FAILURE_KEY",
    "DistributedTransport",
    "DistributedWorld",
    "FailureWatch",
    "PipelineError",
    "TransportStats",
    "model_fingerprint",
]
