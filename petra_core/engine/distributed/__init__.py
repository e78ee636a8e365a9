"""The distributed runtime: the same stage workers and runner as the simulator, one process per rank.

Each rank owns a contiguous range of stages (``engine/placement.py``), builds the same model
from the same seed, keeps its stages, and runs the schedule tick by tick with the one
:class:`~petra_core.engine.pipeline.Pipeline`. Only the world differs: messages go to the rank
owning their destination stage over torch.distributed point-to-point operations (gloo on CPU,
NCCL with one GPU per rank), or through a local FIFO when both stages live on the same rank.

Modules, one job each:

* ``world``     — :class:`DistributedWorld`: joining the process group, this rank's transport,
  the run's collectives (gathers, agreement at tick boundaries), failure reporting;
* ``transport`` — :class:`DistributedTransport`: sends, background receives, flow control,
  settling and checkpointing the messages in flight at a tick boundary;
* ``wire``      — the message format on the wire (header + tensors);
* ``failures``  — :class:`PipelineError`, one-line messages, the shared failure key and watchdog
  that make every rank stop within seconds of the first failure;
* ``pipeline``  — :class:`DistributedPipeline` (the runner in a distributed world), :func:`run_distributed`.

``petra_core.launch`` starts N local ranks without torchrun (tests, benchmarks, ``--spawn``).

``petra train ... runtime=distributed`` under torchrun is the training entry point;
``python -m petra_core.demo`` runs the pipeline on random data. See docs/distributed.md.
"""
from .failures import DEFAULT_TIMEOUT, FAILURE_KEY, FailureWatch, PipelineError, fail
from .pipeline import DistributedPipeline, DistributedResult, run_distributed
from .transport import DistributedTransport, TransportStats, edge_groups
from .world import DistributedWorld, default_device, init_distributed, model_fingerprint

__all__ = [
    "DEFAULT_TIMEOUT", "FAILURE_KEY", "DistributedPipeline", "DistributedResult", "DistributedTransport",
    "DistributedWorld", "FailureWatch", "PipelineError", "TransportStats", "default_device", "edge_groups", "fail",
    "init_distributed", "model_fingerprint", "run_distributed",
]
