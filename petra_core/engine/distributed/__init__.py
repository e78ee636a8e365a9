"""The distributed runtime: the same stage workers as the simulator, one process per rank.

Each rank owns a contiguous range of stages (``engine/placement.py``), builds the same model
from the same seed, keeps its stages, and runs the schedule tick by tick with ``run_tick`` —
exactly the simulator's per-stage code. Only the transport differs: it routes a message to the
rank owning its destination stage over torch.distributed point-to-point operations (gloo on
CPU, NCCL with one GPU per rank), or through a local FIFO when both stages live on the same
rank. Same seed and configuration give the simulator's weights bit for bit on CPU.

Modules, one job each:

* ``wire``      — the message format on the wire (header + tensors);
* ``transport`` — :class:`DistributedTransport`: sends, background receives, flow control,
  settling and checkpointing the messages in flight at a tick boundary;
* ``pipeline``  — :class:`DistributedPipeline` (this rank's stages; ``step()`` like the
  simulator, gathers, ``state_dict()``), :func:`init_distributed`, :func:`run_distributed`;
* ``failures``  — :class:`PipelineError`, one-line messages, the shared failure key and
  watchdog that make every rank stop within seconds of the first failure;
* ``launch``    — :func:`launch_local` (N local ranks without torchrun), :func:`free_port`;
* ``demo``      — ``python -m petra_core.engine.distributed`` on random data.

``petra train ... runtime=distributed`` under torchrun (``petra_core/train.py``) is the
training entry point. See docs/distributed.md.
"""
from .demo import demo_setup, main, parser, synthetic_batch, throughput
from .failures import DEFAULT_TIMEOUT, FAILURE_KEY, FailureWatch, PipelineError, fail
from .launch import free_port, launch_local
from .pipeline import (DistributedPipeline, DistributedResult, RankTimings, default_device, init_distributed,
                       model_fingerprint, run_distributed)
from .transport import DistributedTransport, TransportStats, edge_groups
from .wire import _restore_layout, _unwire, _wire

__all__ = [
    "DEFAULT_TIMEOUT", "FAILURE_KEY", "DistributedPipeline", "DistributedResult", "DistributedTransport",
    "FailureWatch", "PipelineError", "RankTimings", "TransportStats", "default_device", "demo_setup", "edge_groups",
    "fail", "free_port", "init_distributed", "launch_local", "main", "model_fingerprint", "parser",
    "run_distributed", "synthetic_batch", "throughput",
]
