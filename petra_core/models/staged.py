"""A staged model: a sequence of stages, callable end to end, that knows its family.

Which stages a model has is its family's business (``petra_core/families``: image classification
cuts a ResNet or RevNet into stem, one stage per residual block, head).
"""

from __future__ import annotations

from torch import nn

from . import streams
from .stage import Stage


class StagedModel(nn.Sequential):
    """A sequence of :class:`Stage` modules that is also callable end to end (input -> head output).

    ``family``: the :class:`~petra_core.families.ModelFamily` that built it (its loss, metrics and
    inputs; the head stage carries it as ``objective``), kept by slices and copies.
    """

    def __init__(self, arch: str, stages: list[Stage], family=None):
        super().__init__(*stages)
        self.arch, self.family = arch, family

    def forward(self, x):
        """Every stage in turn, the activation moved to each stage's device on the way (a model may
        have its stages on several GPUs, e.g. for evaluation after a multi-GPU run)."""
        for stage in self:
            device = next((t.device for t in stage.parameters()), None)
            if device is not None and streams.device(x) != device:
                x = streams.apply(lambda t, d=device: t.to(d, non_blocking=True), x)
            x = stage(x)
        return x

    def __getitem__(self, index):
        if isinstance(index, slice):  # a contiguous group of stages is again a staged model
            return StagedModel(self.arch, list(self)[index], self.family)
        return super().__getitem__(index)

    @property
    def kinds(self) -> str:
        """Stage kinds as in docs/architecture.md (Stages and models), e.g. ``"S R R D R D R D R H"`` for RevNet18."""
        return " ".join(stage.kind for stage in self)

    @property
    def reversible_stages(self) -> list[int]:
        return [j for j, stage in enumerate(self) if stage.reversible]

    @property
    def has_aux_heads(self) -> bool:
        return all(stage.aux is not None for stage in list(self)[:-1])

    def num_params(self, aux: bool = False) -> int:
        """Parameters of the network (with ``aux``: of its auxiliary heads only)."""
        heads = {id(p) for stage in self if stage.aux is not None for p in stage.aux.parameters()}
        return sum(p.numel() for p in self.parameters() if (id(p) in heads) == aux)
