"""petra_core: PETRA (Parallel End-to-end Training with Reversible Architectures) in PyTorch.

Layers, bottom up: models (stages) -> methods (storage policies) and schedule -> engine (stage
worker, transports, simulator) -> data, config, train -> report -> cli.
"""
from .engine import Simulator, simulate
from .methods import METHODS, get_method
from .models import ARCHS, StagedModel, build_model
from .optim import Recipe
from .schedule import Schedule

__version__ = "0.1.0"
__all__ = ["ARCHS", "METHODS", "Recipe", "Schedule", "Simulator", "StagedModel", "build_model",
           "get_method", "simulate", "__version__"]
