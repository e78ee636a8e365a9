"""Staged ResNets and RevNets (models know nothing of training methods)."""
from .specs import ARCHS, STEMS, ArchSpec
from .stage import LocalGraph, ReversibleStage, Stage
from .staged import StagedModel, build_model

__all__ = ["ARCHS", "STEMS", "ArchSpec", "LocalGraph", "ReversibleStage", "Stage", "StagedModel", "build_model"]
