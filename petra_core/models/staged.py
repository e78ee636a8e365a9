"""Build a staged model from the spec table: stem, one stage per residual block, head."""

from __future__ import annotations

from torch import nn

from . import streams
from .aux_heads import AuxHead
from .blocks import DownsamplingBlock, Head, ResidualStage, ReversibleBlock, Stem
from .spec_check import check_build_args
from .specs import ARCHS, ArchSpec
from .stage import Stage


class StagedModel(nn.Sequential):
    """A sequence of :class:`Stage` modules that is also callable end to end (images -> logits)."""

    def __init__(self, arch: str, stages: list[Stage]):
        super().__init__(*stages)
        self.arch = arch

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
            return StagedModel(self.arch, list(self)[index])
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


def _blocks(spec: ArchSpec, width: int) -> list[tuple[Stage, int]]:
    """One stage per residual block, with its output channels. RevNet widths are per stream (two
    streams per activation)."""
    stages: list[tuple[Stage, int]] = []
    n_streams = 2 if spec.reversible else 1
    c_in = width
    for group, depth in enumerate(spec.layers):
        base = width * 2**group
        c_out = base * spec.expansion
        for i in range(depth):
            stride = 2 if (group > 0 and i == 0) else 1
            if not spec.reversible:
                stage = ResidualStage(spec.block, c_in, base, stride)
            elif stride == 1 and c_in == c_out:
                stage = ReversibleBlock(spec.block, c_out, base)
            else:
                stage = DownsamplingBlock(spec.block, c_in, base, c_out, stride)
            stages.append((stage, n_streams * c_out))
            c_in = c_out
    return stages


def build_model(
    arch: str, *, num_classes: int, stem: str = "cifar", width: int = 64, aux_head: str | None = None
) -> StagedModel:
    """Build ``arch`` as a staged model.

    ``width`` is the base channel count (64 = the paper's models); RevNets double every channel
    count because each activation carries two streams of that width. ``stem`` is ``"cifar"``
    (3x3 conv, no pooling: CIFAR-10, ImageNet32) or ``"imagenet"`` (7x7/2 conv + max-pool).
    ``aux_head`` (``"cnn"`` or ``"linear"``): an auxiliary classifier on every stage but the head,
    for local learning (``aux.py``; ``width // 2`` hidden channels).
    """
    check_build_args(arch, num_classes=num_classes, stem=stem, width=width)
    spec = ARCHS[arch]
    n_streams = 2 if spec.reversible else 1
    blocks = _blocks(spec, width)
    c_last = width * 8 * spec.expansion
    stages = [(Stem(n_streams * width, stem, two_streams=spec.reversible), n_streams * width), *blocks]
    if aux_head is not None:
        for stage, channels in stages:
            stage.aux = AuxHead(aux_head, channels, num_classes, hidden=max(width // 2, 1))
    return StagedModel(arch, [stage for stage, _ in stages] + [Head(n_streams * c_last, num_classes)])
