"""What stages send each other. Forward: activation (+ labels, for the head). Backward: δ, and
the activation itself when the receiving stage rebuilds its input from its output (PETRA)."""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class ForwardMsg:
    mb: int
    activation: Tensor
    labels: Tensor


@dataclass
class BackwardMsg:
    mb: int
    grad: Tensor
    activation: Tensor | None = None  # the sender's (reconstructed) input = the receiver's output
