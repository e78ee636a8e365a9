"""The stage worker, the one tick runner and its worlds (in-process; torch.distributed)."""

from .messages import BackwardMsg, ForwardMsg
from .pipeline import Pipeline, run_stage_tick
from .simulator import Simulator, simulate
from .spec import PipelineSpec, check_k, schedule_for
from .worker import HeadLog, HeadRecord, StageWorker
from .worlds import LocalWorld

__all__ = [
    "BackwardMsg",
    "ForwardMsg",
    "HeadLog",
    "HeadRecord",
    "LocalWorld",
    "Pipeline",
    "PipelineSpec",
    "Simulator",
    "StageWorker",
    "check_k",
    "run_stage_tick",
    "schedule_for",
    "simulate",
]
