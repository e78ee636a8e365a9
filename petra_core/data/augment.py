"""Batched augmentation and normalisation of uint8 image batches, as in the paper.

32×32 data (CIFAR-10, ImageNet32, synthetic) is augmented with a random 32×32 crop of the
image zero-padded by 4 pixels plus a random horizontal flip.  Both are applied to a
whole uint8 batch at once — one gather with per-sample row/column offsets, the flip
folded in by reversing the column index where ``torch.where`` says so — with every
random number drawn from an explicit ``torch.Generator``, so the result is fast and a
pure function of the generator's seed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Normalization:
    """Per-channel mean and standard deviation of pixel values scaled to [0, 1]."""

    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (or [0, 255] float) N×3×H×W -> float32 normalised N×3×H×W."""
        mean = torch.tensor(self.mean, dtype=torch.float32, device=images.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32, device=images.device).view(1, 3, 1, 1)
        return images.to(torch.float32).sub_(255.0 * mean).mul_(1.0 / (255.0 * std))


CIFAR10_NORM = Normalization((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
IMAGENET_NORM = Normalization((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
# Synthetic templates lie in [0.15, 0.85] around 0.5; with the default noise the pixel
# mean is 0.50 and std 0.23, so fixed round values are used (independent of parameters).
SYNTHETIC_NORM = Normalization((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))


def crop_flip(images: torch.Tensor, generator: torch.Generator, *, pad: int = 4,
              flip: bool = True) -> torch.Tensor:
    """Random pad-and-crop (zero padding) and horizontal flip of a uint8 N×H×W×C batch.

    Draws, in this order, N row offsets, N column offsets and N flip bits from
    ``generator`` (offsets in 0 … 2·pad).  Returns a new N×H×W×C tensor of the same dtype.
    """
    if images.ndim != 4:
        raise ValueError(f"images of shape {tuple(images.shape)}; expected N×H×W×C")
    n, h, w, c = images.shape
    oy = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    ox = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    flips = torch.rand(n, generator=generator) < 0.5 if flip else torch.zeros(n, dtype=torch.bool)
    hp, wp = h + 2 * pad, w + 2 * pad
    padded = images.new_zeros((n, hp, wp, c))  # zero padding (faster than F.pad for uint8 NHWC)
    padded[:, pad:pad + h, pad:pad + w] = images
    rows = oy[:, None] + torch.arange(h)[None, :]  # N×H
    col = torch.arange(w)[None, :]
    cols = ox[:, None] + torch.where(flips[:, None], (w - 1) - col, col)  # N×W, reversed if flipped
    # One gather of whole pixels (C bytes each) through flat indices.
    flat = (torch.arange(n) * (hp * wp))[:, None, None] + rows[:, :, None] * wp + cols[:, None, :]
    return padded.view(n * hp * wp, c)[flat.view(-1)].view(n, h, w, c)


def to_model_input(images_hwc: torch.Tensor, norm: Normalization | None) -> torch.Tensor:
    """uint8 N×H×W×3 -> float32 contiguous N×3×H×W, normalised (only scaled to [0, 1] if ``norm`` is None)."""
    x = images_hwc.permute(0, 3, 1, 2).contiguous()  # reorder while still uint8 (4× less memory traffic)
    if norm is None:
        return x.to(torch.float32).div_(255.0)
    return norm(x)
