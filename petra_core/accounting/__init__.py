"""Accounting: measure what the paper only estimated (memory, messages, FLOPs, time, gradient fidelity).

Observes the engine, never steers it. Every function returns tidy data (lists of dicts or pandas
DataFrames) for the report layer; see docs/accounting.md for the conventions.
"""

from ..lazy import lazy

# loaded on first use, so ``petra_core.accounting.commands`` (``petra --help``) imports no torch
_EXPORTS = {
    "AllocationMeter": "held",
    "held_by_policy": "held",
    "held_by_stage": "held",
    "held_total": "held",
    "measure_steady_state": "memory",
    "predict_steady_state": "memory",
    "Recorder": "recorder",
    "stage_shapes": "shapes",
    "network_costs": "table1",
    "per_stage": "table1",
    "representative_stage": "table1",
    "resnet_messages": "table1",
    "run_method": "table1",
    "table1": "table1",
    "memory_components": "table3",
    "table3": "table3",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy(__name__, _EXPORTS)
