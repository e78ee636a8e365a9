"""What stages send each other. Forward: activation (+ labels, for the head). Backward: δ, and
the activation itself when the receiving stage rebuilds its input from its output (PETRA)."""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ..models.streams import Activation


@dataclass
class ForwardMsg:
    mb: int
    activation: Activation  # a tensor, or a RevNet's pair of streams
    labels: Tensor


@dataclass
class BackwardMsg:
    mb: int
    grad: Activation
    activation: Activation | None = None  # the sender's (reconstructed) input = the receiver's output
