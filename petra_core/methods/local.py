"""Local learning on the same stage split: policies that train a stage from its auxiliary head.

Both keep the stage's forward graph (like backprop) and evaluate the stage's auxiliary head
(``stage.aux``, see ``models/aux_heads.py``) on its output at backward time, so its activations are
not held between forward and backward.

* :class:`LocalLoss` (method ``local``) — the stage learns from the loss of its own head only;
  no gradient crosses stages (the network's head learns from the real loss).
* :class:`ForwardGradient` (methods ``fg-local-w``, ``fg-local-a``) — Fournier et al., "Can
  Forward Gradient Match Backpropagation?" (ICML 2023): the update of stage j is the true
  (end-to-end) gradient projected on a *guess*, the gradient of the stage's local loss.
  Weight space (``-w``): per parameter tensor, g_hat = <g, u> / <u, u> * u with g the true and u
  the local-loss gradient of that tensor. Activity space (``-a``): per sample, the true gradient
  of the stage's output is projected on the local-loss gradient of the output, and that estimate
  is backpropagated through the stage. The true gradient comes from the next stage, as in
  backprop: this simulates the directional derivative <g, u> exactly, as the authors' code does.
  A real system would measure it with forward-mode differentiation (``torch.func.jvp`` of the
  network's loss along u), without a backward pass (:func:`directional_derivative`). The auxiliary
  heads learn from their own losses. Where the authors project per sample and per module in
  weight space, this projects per parameter tensor over the minibatch (per-sample weight
  gradients of batch-normalised convolutions are neither cheap nor well defined).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..models import streams
from ..models.stage import LocalGraph, Stage
from ..models.streams import Activation
from ..precision import widen
from .storage import KeepGraph

EPS = 1e-16


def project(target: Tensor, guess: Tensor) -> Tensor:
    """``target`` projected on ``guess``: <target, guess> / <guess, guess> * guess."""
    return (target * guess).sum() / ((guess * guess).sum() + EPS) * guess


def project_per_sample(target: Activation, guess: Activation) -> Activation:
    """The projection of each sample's ``target`` (first dimension) on its ``guess``; a pair of
    streams is one vector per sample (both streams' entries)."""

    def per_sample(a: Tensor, b: Tensor) -> Tensor:
        return (a * b).flatten(1).sum(1)

    pairs = list(zip(streams.tensors(target), streams.tensors(guess)))
    inner = sum(per_sample(t, g) for t, g in pairs)
    norm = sum(per_sample(g, g) for _, g in pairs)
    scale = inner / (norm + EPS)
    return streams.apply(lambda g: scale.view(-1, *[1] * (g.dim() - 1)) * g, guess)


def directional_derivative(loss_of_params, params: list[Tensor], direction: list[Tensor]) -> Tensor:
    """<grad loss(params), direction> by forward-mode differentiation (one forward, no backward):
    what a forward-gradient system measures instead of the simulator's exact inner product."""
    _, value = torch.func.jvp(loss_of_params, (tuple(params),), (tuple(direction),))
    return value


class LocalHead(KeepGraph):
    """The network's head under local learning: the real loss, but no gradient sent back."""

    gradient_out = False
    joins = False  # nothing crosses into the previous stage


class LocalLoss(KeepGraph):
    """Keep the forward graph; at backward, learn from the stage's own auxiliary loss only."""

    name = "graph+local"
    needs_labels = True
    gradient_in = False  # no gradient comes from the next stage ...
    gradient_out = False  # ... and none goes to the previous one
    joins = False

    def backward(
        self, stage: Stage, graph: LocalGraph, grad: Tensor | None, labels: Tensor, k: int, params=None
    ) -> None:
        (F.cross_entropy(stage.aux(widen(streams.join(graph.output))), labels) / k).backward()


class ForwardGradient(KeepGraph):
    """Keep the forward graph; update with the true gradient projected on the local-loss gradient."""

    needs_labels = True
    space = "weight"
    joins = False  # its backward projects the output's gradient: the true one must arrive

    def guess(
        self,
        stage: Stage,
        graph: LocalGraph,
        labels: Tensor,
        k: int,
        wrt: list[Tensor],
        target: list[Tensor],
        output: Activation | None = None,
    ) -> list[Tensor]:
        """The guessed directions for ``wrt``: the gradients of the stage's local loss (``target``,
        the true gradients, is not looked at: a test may guess it exactly). The auxiliary head's
        own parameters get their gradients (the head learns from its loss). ``output``: the stage's
        output as the loss reads it (default: the graph's)."""
        head = list(stage.aux.parameters())
        output = graph.output if output is None else output
        grads = torch.autograd.grad(
            F.cross_entropy(stage.aux(widen(streams.join(output))), labels) / k,
            [*wrt, *head],
            retain_graph=True,
            allow_unused=True,
        )
        for p, g in zip(head, grads[len(wrt) :]):
            if g is not None:
                p.grad = g if p.grad is None else p.grad + g
        return [torch.zeros_like(w) if g is None else g for w, g in zip(wrt, grads[: len(wrt)])]

    def backward(self, stage: Stage, graph: LocalGraph, grad: Tensor, labels: Tensor, k: int, params=None) -> None:
        heads = {id(q) for q in stage.aux.parameters()}
        params = [p for p in stage.parameters() if id(p) not in heads]
        leaves = [leaf for leaf in graph.leaves if leaf.requires_grad]  # the true input gradient goes back
        # a coupling passes its input x on as is: as an output, x gets a view (a node of its own),
        # since autograd.grad cannot take a leaf as an output
        y = streams.apply(lambda t: t.view_as(t) if t.is_leaf and t.requires_grad else t, graph.output)
        outputs, true_out = list(streams.tensors(y)), list(streams.tensors(grad))
        if self.space == "activity":
            guess = self.guess(stage, graph, labels, k, outputs, true_out, output=y)
            estimate = project_per_sample(grad, guess[0] if len(guess) == 1 else tuple(guess))
            torch.autograd.backward(outputs, list(streams.tensors(estimate)), retain_graph=bool(leaves), inputs=params)
            if leaves:
                torch.autograd.backward(outputs, true_out, inputs=leaves)
            return
        true = torch.autograd.grad(outputs, [*params, *leaves], true_out, retain_graph=True, allow_unused=True)
        for leaf, g in zip(leaves, true[len(params) :]):
            leaf.grad = g
        true = [torch.zeros_like(p) if g is None else g for p, g in zip(params, true[: len(params)])]
        for p, g, u in zip(params, true, self.guess(stage, graph, labels, k, params, true, output=y)):
            p.grad = project(g, u) if p.grad is None else p.grad + project(g, u)


class ForwardGradientWeight(ForwardGradient):
    name = "graph+fg-weight"
    space = "weight"


class ForwardGradientActivity(ForwardGradient):
    name = "graph+fg-activity"
    space = "activity"
