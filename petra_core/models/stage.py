"""What every pipeline stage is: a module that knows whether it can run backwards.

Training methods never look inside a stage. They need three things from it:

* ``stage(x)`` — the forward function F_j;
* ``stage.rebuild(x)`` — F_j evaluated on a stored input with a fresh local autograd graph
  (used by methods that buffer inputs: DSP, and PETRA on non-reversible stages);
* for reversible stages, ``stage.reconstruct(y)`` — the input recovered from the output with the
  stage's *current* weights, evaluated so that the local graph is built during the
  reconstruction itself (one F evaluation + one backward, Algorithm 1 of the paper).

Both return a :class:`LocalGraph`, so the engine backpropagates through every stage the same way.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass
class LocalGraph:
    """A stage's local autograd graph: input leaves -> output.

    ``leaves`` are the pieces of the stage input, concatenated along channels (a RevNet activation
    is its two streams side by side). They are autograd leaves, so after ``backward(grad)`` their
    ``.grad`` is the input gradient δ_j.
    """

    leaves: tuple[Tensor, ...]
    output: Tensor
    weights: tuple[Tensor, ...] | None = None  # stashed weight copies the graph was built on, if any

    def backward(self, grad: Tensor) -> None:
        """Backpropagate δ_{j+1} (the gradient of the output) into the leaves and the weights."""
        self.output.backward(grad)

    def input_value(self) -> Tensor:
        """The (possibly reconstructed) stage input, detached."""
        parts = [leaf.detach() for leaf in self.leaves]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def input_grad(self) -> Tensor | None:
        """δ_j, the gradient with respect to the stage input (None if the input needs none)."""
        grads = [leaf.grad for leaf in self.leaves]
        if any(g is None for g in grads):
            return None
        return grads[0] if len(grads) == 1 else torch.cat(grads, dim=1)


class CouplingGraph(LocalGraph):
    """The rebuilt graph of an additive coupling (y, ỹ) = (x̃ + F(x), x): only F's graph is built.

    Backpropagating δ = (δ_y, δ_ỹ) needs no autograd through the sum and the concatenation:
    x̃ receives δ_y, F receives δ_y, and x receives F's input gradient plus δ_ỹ. This saves
    the recomputed output (one activation-sized add and concatenation) and its graph.
    ``output`` is still available, built on demand, for inspection and tests.
    """

    def __init__(self, x: Tensor, x_tilde: Tensor, f: Tensor):
        self.leaves, self.f, self.weights = (x, x_tilde), f, None

    @property
    def output(self) -> Tensor:
        x, x_tilde = self.leaves
        return torch.cat([x_tilde + self.f, x], dim=1)

    def backward(self, grad: Tensor) -> None:
        x, x_tilde = self.leaves
        g_y, g_y_tilde = grad.chunk(2, dim=1)
        self.f.backward(g_y)
        if x.requires_grad:
            x.grad = g_y_tilde if x.grad is None else x.grad.add_(g_y_tilde)
        if x_tilde.requires_grad:
            x_tilde.grad = g_y


class Stage(nn.Module):
    """Base class of every stage. ``kind`` is one of S (stem), R, D, B, H (docs/architecture.md)."""

    reversible: bool = False
    kind: str = "B"

    def rebuild(self, x: Tensor, *, input_grad: bool = True) -> LocalGraph:
        """Recompute F_j on a stored input ``x`` with a local graph (activation checkpointing)."""
        leaf = x.detach().requires_grad_(input_grad and x.is_floating_point())
        return LocalGraph((leaf,), self(leaf))


class ReversibleStage(Stage):
    """A stage whose input can be recomputed exactly from its output (up to float rounding)."""

    reversible = True
    kind = "R"

    def inverse(self, y: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def reconstruct(self, y: Tensor, *, input_grad: bool = True) -> LocalGraph:  # pragma: no cover
        raise NotImplementedError
