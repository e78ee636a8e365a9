"""petra_core: PETRA (Parallel End-to-end Training with Reversible Architectures) in PyTorch.

Floors, bottom up (an import never runs back up a floor):
models (stages) and model families (what a model is trained on) -> methods (storage policies)
and schedule -> engine (stage worker, the one tick runner, its worlds, what a run measures of
itself) -> accounting (observes the engine) -> data, config, grid -> train, runtime (which never
import the accounting) -> report (reads run records only) -> cli.

The names below are loaded on first use, so ``import petra_core.report`` (or any other floor)
does not pull in the engine.
"""

from .lazy import lazy

__version__ = "0.1.0"

_EXPORTS = {
    "ARCHS": "models",
    "StagedModel": "models",
    "build_model": "families",
    "METHODS": "methods",
    "get_method": "methods",
    "Pipeline": "engine",
    "Simulator": "engine",
    "simulate": "engine",
    "Recipe": "optim",
    "Schedule": "methods.schedule",
}
__all__ = [*sorted(_EXPORTS), "__version__"]
__getattr__, __dir__ = lazy(__name__, _EXPORTS)
