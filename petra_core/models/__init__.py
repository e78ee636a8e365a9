"""Staged ResNets and RevNets (models know nothing of training methods).

Names are loaded on first use: reading the spec table (``specs``) or the stage interface
(``stage``) does not build the blocks.
"""
from importlib import import_module

_EXPORTS = {"ARCHS": "specs", "STEMS": "specs", "ArchSpec": "specs",
            "LocalGraph": "stage", "CouplingGraph": "stage", "ReversibleStage": "stage", "Stage": "stage",
            "StagedModel": "staged", "build_model": "staged"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
