"""The 1×1 convolution of the image models, safe from a oneDNN kernel bug on the CPU.

A 1×1 convolution with stride s is the same function as subsampling every s-th row and column,
then a 1×1 convolution at stride 1. oneDNN's CPU kernel for the strided case's weight gradient
(``jit_1x1`` backward-weights with its reduce-to-unit-stride workspace) writes past that
workspace when the input is channels-last and has fewer channels than the kernel's channel block
(8 with AVX2, 16 with AVX-512): the process hangs, dies of a segfault or a heap corruption, or,
worst, gets wrong weight gradients without a word (oneDNN issue 6035, open at torch 2.14.1).
Real widths never meet it (the projections of a width-64 RevNet have 64 channels and more); the
tiny models of the tests and ``width`` = 4 or 8 runs on a CPU do. There, this module does the
subsampling itself, so the kernel runs at stride 1, where it is correct. Everywhere else it is a
plain ``nn.Conv2d``: the same parameters, state-dict keys, FLOPs and bits (so a record trained
on an AVX2 machine at width 8, whose 8-channel projection the kernel handles, retrains to its bits).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn


@functools.cache
def channel_block() -> int:
    """The channel block of oneDNN's 1×1 kernels on this CPU: 8 with AVX2, else 16 (AVX-512, and
    where the ISA is not known: the safe side). Below it, the strided kernel is unsafe."""
    return 8 if torch.backends.cpu.get_cpu_capability() == "AVX2" else 16


def hits_the_strided_kernel_bug(conv: nn.Conv2d, x: Tensor) -> bool:
    """Whether ``conv`` on ``x`` would take oneDNN's unsafe strided 1×1 backward-weights kernel."""
    return (
        x.device.type == "cpu"
        and conv.stride != (1, 1)
        and conv.in_channels < channel_block()
        and x.dim() == 4
        and not x.is_contiguous()
        and x.is_contiguous(memory_format=torch.channels_last)
    )


class PointwiseConv(nn.Conv2d):
    """``nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)``, computed as subsample → stride-1
    convolution where oneDNN's strided kernel is unsafe (:func:`hits_the_strided_kernel_bug`)."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__(c_in, c_out, 1, stride=stride, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        if not hits_the_strided_kernel_bug(self, x):
            return super().forward(x)
        sh, sw = self.stride
        return nn.functional.conv2d(x[:, :, ::sh, ::sw], self.weight, None, 1, 0, self.dilation, self.groups)
