"""The registered model families, and a model built by the family that offers its arch.

A family is registered once (the image and transformer families here; another from its own module,
or a test):
from then on ``build(arch, ...)`` builds its archs and the engine trains them unchanged.
"""

from __future__ import annotations

from ..models.staged import StagedModel
from .family import ModelFamily
from .image import IMAGES
from .transformers import CHARACTERS, VISION_TRANSFORMERS

FAMILIES: dict[str, ModelFamily] = {}


def register_family(family: ModelFamily) -> ModelFamily:
    """Add ``family`` (replacing one of the same name); its archs must be new to the other families."""
    if not isinstance(family, ModelFamily):
        raise ValueError(f"a model family must be a ModelFamily, got {family!r}")
    taken = {a: f.name for f in FAMILIES.values() if f.name != family.name for a in f.archs}
    clash = [f"{a} ({taken[a]})" for a in family.archs if a in taken]
    if clash:
        raise ValueError(f"family {family.name!r} offers archs another family offers: {', '.join(clash)}")
    FAMILIES[family.name] = family
    return family


def family_of(arch: object) -> ModelFamily:
    """The family that offers ``arch``."""
    for family in FAMILIES.values():
        if arch in family.archs:
            return family
    allowed = ", ".join(a for f in FAMILIES.values() for a in f.archs)
    raise ValueError(f"unknown arch {arch!r}; allowed: {allowed}")


def build(arch: str, **options) -> StagedModel:
    """``arch`` built by its family (options as that family's ``build`` takes them)."""
    return family_of(arch).build(arch, **options)


register_family(IMAGES)
register_family(VISION_TRANSFORMERS)
register_family(CHARACTERS)
