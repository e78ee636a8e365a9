"""What stages send each other. Forward: activation (+ labels, for the head). Backward: δ, and
the activation itself when the receiving stage rebuilds its input from its output (PETRA)."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

from torch import Tensor

from ..models import streams
from ..models.streams import Activation


@dataclass
class ForwardMsg:
    mb: int
    activation: Activation  # a tensor, or a RevNet's pair of streams (with its graph, to a stage that joins it)
    labels: Tensor


@dataclass
class BackwardMsg:
    mb: int
    grad: Activation | None  # None: the sender's graph joined the receiver's, and its backward went on through it
    activation: Activation | None = None  # the sender's (reconstructed) input = the receiver's output


def saved(msg) -> dict:
    """``msg``'s fields for a checkpoint, as copies and without a graph (a resumed run's stages
    start from separate graphs, which give the same gradients)."""

    def copied(v):
        return copy.deepcopy(streams.apply(Tensor.detach, v) if isinstance(v, Tensor) or streams.is_pair(v) else v)

    return {f.name: copied(getattr(msg, f.name)) for f in dataclasses.fields(msg)}
