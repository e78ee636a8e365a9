"""Accounting: measure what the paper only estimated (memory, messages, FLOPs, time, gradient fidelity).

Observes the engine, never steers it. Every function returns tidy data (lists of dicts or pandas
DataFrames) for the report layer; see docs/accounting.md for the conventions.
"""

from .held import AllocationMeter, held_by_policy, held_by_stage, held_total
from .memory import measure_steady_state, predict_steady_state
from .recorder import Recorder
from .shapes import stage_shapes
from .table1 import network_costs, per_stage, representative_stage, resnet_messages, run_method, table1
from .table3 import memory_components, table3

__all__ = [
    "AllocationMeter",
    "Recorder",
    "held_by_policy",
    "held_by_stage",
    "held_total",
    "measure_steady_state",
    "memory_components",
    "network_costs",
    "per_stage",
    "predict_steady_state",
    "representative_stage",
    "resnet_messages",
    "run_method",
    "stage_shapes",
    "table1",
    "table3",
]
