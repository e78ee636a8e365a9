"""The stage modules: stems, residual blocks (plain, reversible, downsampling) and heads.

RevNet activations are a pair of streams (x, x̃), two dense tensors (``streams.py`` says why):
the RevNet stem splits its output into them, every RevNet stage maps a pair to a pair, and the
head pools both. Design facts (which block is invertible,
where projections sit) follow ``docs/architecture.md``, Blocks; the residual branch F ends with
a ReLU, as in the authors' models.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchvision.models.resnet import BasicBlock, Bottleneck

from . import streams
from .pointwise import PointwiseConv
from .stage import CouplingGraph, ReversibleStage, Stage


def conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1, relu: bool = True) -> nn.Sequential:
    """conv (no bias: batch norm follows) -> BN (-> ReLU)."""
    conv = (
        PointwiseConv(c_in, c_out, stride)
        if kernel == 1
        else nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False)
    )
    layers: list[nn.Module] = [
        conv,
        nn.BatchNorm2d(c_out),
    ]
    if relu:
        layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


def residual_branch(block: str, c_in: int, base: int, c_out: int, stride: int) -> nn.Sequential:
    """F: the residual function of a basic or bottleneck block, acting on one stream."""
    if block == "basic":
        return nn.Sequential(conv_bn(c_in, base, 3, stride), conv_bn(base, c_out, 3))
    return nn.Sequential(conv_bn(c_in, base, 1), conv_bn(base, base, 3, stride), conv_bn(base, c_out, 1))


class Stem(Stage):
    """First stage: conv -> BN -> ReLU (-> max-pool for the ImageNet stem); a RevNet's stem
    (``two_streams``) hands its channel halves on as the pair of streams."""

    kind = "S"

    def __init__(self, c_out: int, stem: str, two_streams: bool = False):
        super().__init__()
        self.two_streams = two_streams
        if stem == "cifar":  # CIFAR-10 / ImageNet32: 3x3 stride-1 convolution, no pooling
            self.body = conv_bn(3, c_out, 3)
        else:  # ImageNet: 7x7 stride-2 convolution + standard 3x3/s2 max-pool
            self.body = nn.Sequential(conv_bn(3, c_out, 7, stride=2), nn.MaxPool2d(3, 2, 1))

    def forward(self, x: Tensor) -> streams.Activation:
        y = self.body(x)
        return streams.streams_of(y) if self.two_streams else y


class ResidualStage(Stage):
    """One torchvision ResNet block (BasicBlock or Bottleneck) as a stage."""

    kind = "B"

    def __init__(self, block: str, c_in: int, base: int, stride: int):
        super().__init__()
        cls = BasicBlock if block == "basic" else Bottleneck
        c_out = base * cls.expansion
        downsample = None
        if stride != 1 or c_in != c_out:
            downsample = nn.Sequential(PointwiseConv(c_in, c_out, stride), nn.BatchNorm2d(c_out))
        self.block = cls(c_in, base, stride=stride, downsample=downsample)

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class ReversibleBlock(ReversibleStage):
    """Additive coupling (x, x̃) -> (x̃ + F(x), x); inverse x = ỹ, x̃ = y − F(ỹ)."""

    def __init__(self, block: str, channels: int, base: int):
        super().__init__()
        self.F = residual_branch(block, channels, base, channels, stride=1)

    def forward(self, x: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        x1, x2 = x
        return x2 + self.F(x1), x1

    @torch.no_grad()
    def inverse(self, y: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        y1, y2 = y
        return y2, y1 - self.F(y2)

    def reconstruct(self, y: tuple[Tensor, Tensor], *, input_grad: bool = True) -> CouplingGraph:
        """Rebuild the input with the current weights while building F's graph.

        x = ỹ is exact; F(x) is evaluated once with autograd on, and serves both to recover
        x̃ = y − F(x) and as the graph of the recomputed output (x̃ + F(x), x).
        """
        y1, y2 = (t.detach() for t in y)
        x1 = y2.requires_grad_(input_grad)
        f = self.F(x1)
        x2 = (y1 - f.detach()).requires_grad_(input_grad)
        return CouplingGraph(x1, x2, f)


class DownsamplingBlock(Stage):
    """A RevNet block that changes resolution or width; not invertible, so it buffers its input.

    basic:      y = F(x) + P(x̃),  ỹ = hidden activation of F after its first conv-BN-ReLU
    bottleneck: y = F(x) + P(x̃),  ỹ = Q(x)   (one 1x1 projection per stream)
    """

    kind = "D"

    def __init__(self, block: str, c_in: int, base: int, c_out: int, stride: int):
        super().__init__()
        self.block_type = block
        self.F = residual_branch(block, c_in, base, c_out, stride)
        self.proj = conv_bn(c_in, c_out, 1, stride, relu=False)
        if block == "bottleneck":
            self.proj_x = conv_bn(c_in, c_out, 1, stride, relu=False)

    def forward(self, x: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        x1, x2 = x
        if self.block_type == "basic":
            hidden = self.F[0](x1)
            return self.F[1](hidden) + self.proj(x2), hidden
        return self.F(x1) + self.proj(x2), self.proj_x(x1)


class Head(Stage):
    """Last stage: global average pool -> linear. The loss is its family's (``head.objective``), taken by its worker."""

    kind = "H"

    def __init__(self, c_in: int, num_classes: int):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x: streams.Activation) -> Tensor:
        """Both streams of a pair pooled side by side: the pooled features of the joined tensor."""
        pooled = [torch.flatten(self.pool(t), 1) for t in streams.tensors(x)]
        return self.fc(pooled[0] if len(pooled) == 1 else torch.cat(pooled, 1))
