"""petra_core: PETRA (Parallel End-to-end Training with Reversible Architectures) in PyTorch."""
from .models import ARCHS, StagedModel, build_model

__version__ = "0.1.0"
__all__ = ["ARCHS", "StagedModel", "build_model", "__version__"]
