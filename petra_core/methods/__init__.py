"""Training methods as stage policies (see registry.py for the table)."""

from .local import ForwardGradient, LocalLoss, directional_derivative, project, project_per_sample
from .registry import METHODS, Method, check_method_fits, get_method
from .storage import KeepGraph, KeepInput, Reconstruct, StashWeights, StoragePolicy

__all__ = [
    "METHODS",
    "Method",
    "check_method_fits",
    "get_method",
    "KeepGraph",
    "KeepInput",
    "Reconstruct",
    "StashWeights",
    "StoragePolicy",
    "ForwardGradient",
    "LocalLoss",
    "directional_derivative",
    "project",
    "project_per_sample",
]
