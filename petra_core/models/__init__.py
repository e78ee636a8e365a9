"""Stages and staged models: ResNet and RevNet blocks, the spec table (models know nothing of training methods).

Names are loaded on first use: reading the spec table (``specs``) or the stage interface
(``stage``) does not build the blocks.
"""

from ..lazy import lazy

_EXPORTS = {
    "ARCHS": "specs",
    "STEMS": "specs",
    "ArchSpec": "specs",
    "LocalGraph": "stage",
    "CouplingGraph": "stage",
    "ReversibleStage": "stage",
    "Stage": "stage",
    "StagedModel": "staged",
    "AuxHead": "aux_heads",
    "AUX_HEADS": "aux_heads",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy(__name__, _EXPORTS)
