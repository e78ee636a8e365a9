"""Delayed gradients in plain PyTorch, with any delay per stage: a reference, not a method.

The engine's ``delayed`` method (weight stashing) trains stage j on the gradient of minibatch m
computed through the weights stage j held at m's forward, and applies it ``staleness(j)`` =
2(J − 1 − j) of its own steps after that forward. Since every stage's forward of m sees exactly the
updates of minibatches < m − 2(J − 1 − j) (methods/schedule.py), the same training is a loop with
no pipeline at all: forward and backward the whole model on m with the current weights, queue each
stage's gradient, and let stage j apply the gradient it queued ``delays[j]`` minibatches ago; at the
end, apply what is left in order (the drain). With ``delays = [staleness(j)]`` this is the engine's
``delayed`` run to rounding (tests/test_delayed_reference.py, float64); with other delays it asks
what the engine cannot: which stage's delay costs what (``benchmarks/delay_sensitivity.py``).

Each stage gets the engine's optimizer and schedule (:func:`petra_core.optim.make_optimizer`), or
the ones ``optimizers_for`` builds (the benchmark's Muon on the blocks' matrices).
``predict`` adds linear weight prediction (PipeMare, XPipe): each stage's forward and backward run
at w + predict · delay · Δw, Δw its last update, the weights it will hold when the gradient lands.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..models.staged import StagedModel
from ..optim import Recipe, make_optimizer

Batch = tuple[torch.Tensor, torch.Tensor]


def train_delayed(
    model: StagedModel,
    get_batch: Callable[[int], Batch],
    num_batches: int,
    delays: Sequence[int],
    recipe: Recipe,
    *,
    batch_size: int,
    batches_per_epoch: float | None = None,
    predict: float = 0.0,
    optimizers_for: Callable[[int, nn.Module, float], list[tuple]] | None = None,
) -> list[float]:
    """Train ``model`` in place on minibatches ``get_batch(0..num_batches-1)``, stage j's gradients
    applied ``delays[j]`` minibatches late; return each minibatch's loss. ``optimizers_for(j,
    stage, steps_per_epoch)``: the (optimizer, schedule) pairs that step stage j (default: the
    engine's one, :func:`~petra_core.optim.make_optimizer` with ``recipe``)."""
    if len(delays) != len(model) or any(not isinstance(d, int) or d < 0 for d in delays):
        raise ValueError(f"delays={list(delays)!r}; expected {len(model)} non-negative integers, one per stage")
    steps_per_epoch = batches_per_epoch or max(num_batches, 1)
    build = optimizers_for or engines_optimizer(recipe, batch_size)
    optimizers = [build(j, stage, steps_per_epoch) for j, stage in enumerate(model)]
    queues: list[deque] = [deque() for _ in model]
    last = [[torch.zeros_like(p) for p in stage.parameters()] for stage in model]

    def step(j: int) -> None:
        stage = model[j]
        for p, g in zip(stage.parameters(), queues[j].popleft()):
            p.grad = g
        before = [p.detach().clone() for p in stage.parameters()] if predict else None
        for opt, sched in optimizers[j]:
            opt.step()
            sched.step()
        if predict:
            last[j] = [p.detach() - b for p, b in zip(stage.parameters(), before)]

    losses = []
    for m in range(num_batches):
        x, y = get_batch(m)
        held = _shift(model, last, delays, predict)
        loss = model.family.loss(model(x), y)
        for stage in model:
            stage.zero_grad(set_to_none=True)
        loss.backward()
        _restore(model, held)
        losses.append(float(loss.detach()))
        for j, stage in enumerate(model):
            queues[j].append([torch.zeros_like(p) if p.grad is None else p.grad for p in stage.parameters()])
            if len(queues[j]) > delays[j]:
                step(j)
    for j in range(len(model)):  # the drain: the gradients still in flight, in order
        while queues[j]:
            step(j)
    return losses


def engines_optimizer(recipe: Recipe, batch_size: int):
    """The default ``optimizers_for``: each stage's optimizer and schedule as the engine builds them."""

    def optimizers_for(j: int, stage: nn.Module, steps_per_epoch: float) -> list[tuple]:
        return [make_optimizer(stage, recipe, batch_size=batch_size, k=1, steps_per_epoch=steps_per_epoch)]

    return optimizers_for


@torch.no_grad()
def _shift(model: StagedModel, last, delays, predict: float):
    """Move each stage to its predicted weights (``predict`` > 0); return what to restore."""
    if not predict:
        return None
    held = []
    for j, stage in enumerate(model):
        held.append([p.detach().clone() for p in stage.parameters()])
        for p, d in zip(stage.parameters(), last[j]):
            p.add_(d, alpha=predict * delays[j])
    return held


@torch.no_grad()
def _restore(model: StagedModel, held) -> None:
    if held is not None:
        for stage, weights in zip(model, held):
            for p, w in zip(stage.parameters(), weights):
                p.copy_(w)
