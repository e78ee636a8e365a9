"""``build_model``, the name the models floor has always offered for a ResNet or RevNet: the
image-classification family builds it (``petra_core/families/image.py``)."""

from __future__ import annotations

from ..families.image import IMAGES
from .staged import StagedModel


def build_model(
    arch: str, *, num_classes: int, stem: str = "cifar", width: int = 64, aux_head: str | None = None
) -> StagedModel:
    """``arch`` (``resnet18/34/50``, ``revnet18/34/50``) for ``num_classes`` classes, as
    :meth:`~petra_core.families.image.ImageClassification.build` builds it."""
    return IMAGES.build(arch, num_classes=num_classes, stem=stem, width=width, aux_head=aux_head)
