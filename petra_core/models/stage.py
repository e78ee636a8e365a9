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

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from . import streams
from .streams import Activation


def backpropagate(
    outputs: Sequence[Tensor], grads: Sequence[Tensor | None], leaves: Sequence[Tensor], params: Sequence[Tensor]
) -> None:
    """``grads`` of ``outputs`` into the ``.grad`` of ``leaves`` and ``params``, as
    ``torch.autograd.backward`` would put them there, but without its copy of a leaf's gradient that
    the caller still holds: a coupling hands the next stage's δ_y to its input x̃ as is, and a
    leaf's AccumulateGrad would clone it, an activation-sized copy per stage and minibatch."""
    # a coupling passes its input on as an output; autograd.grad needs a node of its own there
    outputs = [t.view_as(t) if t.is_leaf else t for t in outputs]
    wrt = [t for t in (*leaves, *params) if t.requires_grad]
    if not wrt:
        return
    for t, g in zip(wrt, torch.autograd.grad(outputs, wrt, grads, allow_unused=True)):
        if g is None:
            continue
        if t.grad is not None:
            t.grad.add_(g)
        elif g.stride() != t.stride():  # AccumulateGrad's layout contract: a grad is laid out as its tensor
            t.grad = torch.empty_strided(t.shape, t.stride(), dtype=g.dtype, device=g.device).copy_(g)
        else:
            t.grad = g


@dataclass
class LocalGraph:
    """A stage's local autograd graph: input leaves -> output.

    ``inputs`` is the stage input as autograd leaves, in the activation's own kind (a tensor, or
    a RevNet's pair of streams, ``models/streams.py``), so after ``backward(grad)`` their ``.grad``
    is the input gradient δ_j. A *joined* graph's inputs are the previous stage's outputs
    themselves, graph and all: its backward runs on into that stage (and any it joins), whose
    weights receive their gradients with this stage's, and no input gradient is left to send.
    """

    inputs: Activation
    output: Activation
    weights: tuple[Tensor, ...] | None = None  # stashed weight copies the graph was built on, if any
    joined: bool = False

    @property
    def leaves(self) -> tuple[Tensor, ...]:
        return streams.tensors(self.inputs)

    def backward(self, grad: Activation, params: Sequence[Tensor] | None = None) -> None:
        """Backpropagate δ_{j+1} (the gradient of the output) into the leaves and the weights:
        ``params``, the weights the graph was built on, or all that autograd reaches (None)."""
        pairs = [(t, g) for t, g in zip(streams.tensors(self.output), streams.tensors(grad)) if t.requires_grad]
        if params is None or self.joined:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
        else:
            backpropagate([t for t, _ in pairs], [g for _, g in pairs], self.leaves, params)

    def input_value(self) -> Activation:
        """The (possibly reconstructed) stage input, detached."""
        return streams.apply(Tensor.detach, self.inputs)

    def input_grad(self) -> Activation | None:
        """δ_j, the gradient with respect to the stage input (None if the input needs none, or the
        graph is joined: the backward went on into the previous stage)."""
        return None if self.joined else streams.grads(self.inputs)


class CouplingGraph(LocalGraph):
    """The rebuilt graph of an additive coupling (y, ỹ) = (x̃ + F(x), x): only F's graph is built.

    Backpropagating δ = (δ_y, δ_ỹ) needs no autograd through the sum: x̃ receives δ_y, F receives
    δ_y, and x receives F's input gradient plus δ_ỹ. This saves the recomputed output (one
    activation-sized add) and its graph. ``output`` is still available, built on demand, for
    inspection and tests.
    """

    def __init__(self, x: Tensor, x_tilde: Tensor, f: Tensor):
        self.inputs, self.f, self.weights = (x, x_tilde), f, None

    @property
    def output(self) -> Activation:
        x, x_tilde = self.inputs
        return (x_tilde + self.f, x)

    def backward(self, grad: Activation, params: Sequence[Tensor] | None = None) -> None:
        x, x_tilde = self.inputs
        g_y, g_y_tilde = grad
        self.f.backward(g_y)
        if x.requires_grad:
            x.grad = g_y_tilde if x.grad is None else x.grad.add_(g_y_tilde)
        if x_tilde.requires_grad:
            x_tilde.grad = g_y


class Stage(nn.Module):
    """Base class of every stage. ``kind`` is one of S (stem), R, D, B, H (docs/architecture.md)."""

    reversible: bool = False
    kind: str = "B"
    objective = None  # the head's: its model family, whose loss the head's worker takes (families/family.py)

    def __init__(self):
        super().__init__()
        self.aux: nn.Module | None = None  # local learning's auxiliary head, set by build_model (aux_heads.py)

    def rebuild(self, x: Activation, *, input_grad: bool = True) -> LocalGraph:
        """Recompute F_j on a stored input ``x`` with a local graph (activation checkpointing)."""
        leaf = streams.leaves(x, input_grad)
        return LocalGraph(leaf, self(leaf))


class ReversibleStage(Stage):
    """A stage whose input can be recomputed exactly from its output (up to float rounding)."""

    reversible = True
    kind = "R"

    def inverse(self, y: Activation) -> Activation:  # pragma: no cover - abstract
        raise NotImplementedError

    def reconstruct(self, y: Activation, *, input_grad: bool = True) -> LocalGraph:  # pragma: no cover
        raise NotImplementedError
