"""Image classification: ResNet/RevNet 18/34/50 (``models/specs.py``) on (batch, 3, H, W) images
with integer labels; mean cross-entropy loss, top-1 in training, loss/top-1/top-5 at evaluation.

The model is cut as docs/architecture.md says: stem, one stage per residual block, head.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..models.aux_heads import AuxHead
from ..models.blocks import DownsamplingBlock, Head, ResidualStage, ReversibleBlock, Stem
from ..models.spec_check import check_build_args
from ..models.specs import ARCHS, ArchSpec
from ..models.stage import Stage
from ..models.staged import StagedModel
from ..precision import widen
from .family import ModelFamily


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


class ImageClassification(ModelFamily):
    name = "image-classification"
    train_sums = ("correct",)
    eval_names = ("test_loss", "top1", "top5")

    @property
    def archs(self) -> tuple[str, ...]:
        return tuple(ARCHS)

    def build(
        self, arch: str, *, num_classes: int, stem: str = "cifar", width: int = 64, aux_head: str | None = None
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
        return self.staged(arch, [stage for stage, _ in stages] + [Head(n_streams * c_last, num_classes)])

    def loss(self, output: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(widen(output), targets)  # bf16 logits: the loss in float32

    def minibatch_sums(self, output: Tensor, targets: Tensor) -> Tensor:
        return (output.argmax(1) == targets).sum().reshape(1)

    def train_record(self, loss_sum: float, sums: Sequence[float], n: int) -> dict:
        (correct,) = sums
        return {"train_loss": loss_sum / n, "train_acc": 100 * correct / n}

    def eval_sums(self, output: Tensor, targets: Tensor) -> Mapping[str, float]:
        top = output.topk(min(5, output.shape[1]), dim=1).indices
        return {
            "loss": float(F.cross_entropy(output, targets, reduction="sum")),
            "top1": float((top[:, 0] == targets).sum()),
            "top5": float((top == targets[:, None]).any(dim=1).sum()),
        }

    def eval_record(self, sums: Mapping[str, float], n: float) -> dict:
        """Test loss, top-1 and top-5 (%)."""
        return {"test_loss": sums["loss"] / n, "top1": 100 * sums["top1"] / n, "top5": 100 * sums["top5"] / n}

    def sample_input(self, batch: int, *, device=None, image_size: int) -> Tensor:
        return torch.zeros(batch, 3, image_size, image_size, device=device)


IMAGES = ImageClassification()


def build_model(
    arch: str, *, num_classes: int, stem: str = "cifar", width: int = 64, aux_head: str | None = None
) -> StagedModel:
    """``arch`` (``resnet18/34/50``, ``revnet18/34/50``) for ``num_classes`` classes, as
    :meth:`~petra_core.families.image.ImageClassification.build` builds it."""
    return IMAGES.build(arch, num_classes=num_classes, stem=stem, width=width, aux_head=aux_head)
