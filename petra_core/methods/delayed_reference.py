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
    delayed: Callable[[str], bool] | None = None,
) -> list[float]:
    """Train ``model`` in place on minibatches ``get_batch(0..num_batches-1)``, stage j's gradients
    applied ``delays[j]`` minibatches late; return each minibatch's loss. ``optimizers_for(j,
    stage, steps_per_epoch)``: the (optimizer, schedule) pairs that step stage j (default: the
    engine's one, :func:`~petra_core.optim.make_optimizer` with ``recipe``). ``delayed(name)``: which
    of a stage's parameters (by name within the stage) wait its delay; the others step on time, the
    stage stepping at every minibatch with the gradients that are due (a parameter with none due yet
    is skipped: its ``grad`` is None). Default: all of them, stage by stage as the engine does."""
    if len(delays) != len(model) or any(not isinstance(d, int) or d < 0 for d in delays):
        raise ValueError(f"delays={list(delays)!r}; expected {len(model)} non-negative integers, one per stage")
    steps_per_epoch = batches_per_epoch or max(num_batches, 1)
    build = optimizers_for or engines_optimizer(recipe, batch_size)
    stages = [
        _DelayedStage(stage, build(j, stage, steps_per_epoch), delays[j], delayed) for j, stage in enumerate(model)
    ]
    losses = []
    for m in range(num_batches):
        x, y = get_batch(m)
        held = [stage.shift(predict) for stage in stages]
        loss = model.family.loss(model(x), y)
        model.zero_grad(set_to_none=True)
        loss.backward()
        for stage, weights in zip(stages, held):
            stage.restore(weights)
        losses.append(float(loss.detach()))
        for stage in stages:
            stage.arrive(predict)
    for stage in stages:  # the drain: the gradients still in flight, in order
        stage.drain(predict)
    return losses


class _DelayedStage:
    """One stage of the reference: its optimizers, each parameter's delay (its lag), the gradients
    of the last max(lag) minibatches (oldest first) and its last update (for weight prediction)."""

    def __init__(self, stage: nn.Module, optimizers: list[tuple], delay: int, delayed: Callable[[str], bool] | None):
        self.optimizers = optimizers
        self.params = list(stage.parameters())
        self.lags = [delay if delayed is None or delayed(name) else 0 for name, _ in stage.named_parameters()]
        self.keep = max(self.lags, default=0)
        self.queue: deque = deque()
        self.last = [torch.zeros_like(p) for p in self.params]

    def arrive(self, predict: float) -> None:
        """The minibatch's gradients are in ``.grad``: queue them, step with what is due."""
        self.queue.append([torch.zeros_like(p) if p.grad is None else p.grad for p in self.params])
        if self._due(len(self.queue)):
            self._step(predict)
        if len(self.queue) > self.keep:
            self.queue.popleft()

    def drain(self, predict: float) -> None:
        for later in range(1, self.keep + 1):  # the steps `later` minibatches after the last
            if self._due(len(self.queue) + later):
                self._step(predict)

    def _due(self, waiting: int) -> bool:
        """Give each parameter the gradient due when ``waiting`` minibatches have arrived since the
        queue's oldest (None: none due yet, or none left); is any due?"""
        for i, p in enumerate(self.params):
            age = waiting - 1 - self.lags[i]  # the index of its due gradient, oldest first
            p.grad = self.queue[age][i] if 0 <= age < len(self.queue) else None
        return any(p.grad is not None for p in self.params)

    def _step(self, predict: float) -> None:
        before = [p.detach().clone() for p in self.params] if predict else None
        for opt, sched in self.optimizers:
            opt.step()
            sched.step()
        if predict:
            self.last = [p.detach() - b for p, b in zip(self.params, before)]

    @torch.no_grad()
    def shift(self, predict: float):
        """Move to the predicted weights w + predict · lag · Δw (``predict`` > 0); what to restore."""
        if not predict:
            return None
        held = [p.detach().clone() for p in self.params]
        for p, d, lag in zip(self.params, self.last, self.lags):
            p.add_(d, alpha=predict * lag)
        return held

    @torch.no_grad()
    def restore(self, held) -> None:
        if held is not None:
            for p, w in zip(self.params, held):
                p.copy_(w)


def engines_optimizer(recipe: Recipe, batch_size: int):
    """The default ``optimizers_for``: each stage's optimizer and schedule as the engine builds them."""

    def optimizers_for(j: int, stage: nn.Module, steps_per_epoch: float) -> list[tuple]:
        return [make_optimizer(stage, recipe, batch_size=batch_size, k=1, steps_per_epoch=steps_per_epoch)]

    return optimizers_for
