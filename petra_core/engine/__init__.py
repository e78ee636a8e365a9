"""The stage worker and its transports (in-process simulator; torch.distributed)."""
from .distributed import DistributedPipeline, PipelineError, init_distributed, run_distributed
from .messages import BackwardMsg, ForwardMsg
from .pipeline import build_workers, check_k, run_tick, schedule_for
from .simulator import Simulator, simulate
from .worker import StageWorker

__all__ = ["BackwardMsg", "DistributedPipeline", "ForwardMsg", "PipelineError", "Simulator", "StageWorker",
           "build_workers", "check_k", "init_distributed", "run_distributed", "run_tick", "schedule_for", "simulate"]
