"""Architecture spec tables: one row per model, no builder per depth.

A model is described by its block family, the number of blocks in each of the four
resolution groups, and whether it is the reversible (RevNet) variant. Everything else
(channel widths, which blocks downsample, stage kinds) is derived from these rows in
:mod:`petra_core.models.staged`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArchSpec:
    """One row of the architecture table."""

    block: str  # "basic" or "bottleneck"
    layers: tuple[int, int, int, int]  # blocks per resolution group
    reversible: bool

    @property
    def expansion(self) -> int:
        """Output channels of a block relative to its base width (ResNet convention)."""
        return 4 if self.block == "bottleneck" else 1


ARCHS: dict[str, ArchSpec] = {
    "resnet18": ArchSpec("basic", (2, 2, 2, 2), reversible=False),
    "resnet34": ArchSpec("basic", (3, 4, 6, 3), reversible=False),
    "resnet50": ArchSpec("bottleneck", (3, 4, 6, 3), reversible=False),
    "revnet18": ArchSpec("basic", (2, 2, 2, 2), reversible=True),
    "revnet34": ArchSpec("basic", (3, 4, 6, 3), reversible=True),
    "revnet50": ArchSpec("bottleneck", (3, 4, 6, 3), reversible=True),
}

STEMS = ("cifar", "imagenet")
