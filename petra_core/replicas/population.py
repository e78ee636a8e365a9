"""Populations: N models trained side by side to be averaged (or ensembled) at the end.

No gradient crosses replicas here: each replica trains its own model on its own shard of every
epoch. What the replicas do together happens after a step, on the weights (``after_step``):

* ``independent``: nothing (a plain ensemble; its naive weight average is the control);
* ``papa`` (Population Parameter Averaging, Jolicoeur-Martineau et al.): every ``every`` steps
  each model moves towards the population's average, θ_i ← (1 − λ)·θ_i + λ·mean(θ), with
  λ = ``rate`` · lr / lr₀ (the learning rate relative to its base), over the parameters and the
  batch-norm running statistics — one all-reduce of the whole stage. ``phase`` says which steps:
  ``petra`` after steps every, 2·every, … counted over the whole run; ``official`` as the authors'
  code, after the step whose index i, counted from 0 in each epoch, has i % every == 0 (steps 1,
  every + 1, … of each epoch, 1-based);
* ``wash`` (Fournier et al., arXiv 2405.17517): after every step each scalar of parameter tensor k
  (of the network's K, in network order) is selected with probability p_k = p · (1 − k/(K − 1)),
  early layers most, and each selected scalar is moved between the models by its own uniform
  random permutation. Only the selected entries travel (an all-gather of them).

Every random draw comes from a generator seeded by (seed, step, stage), the same on every
replica and rank, so the simulator and torch.distributed agree bit for bit and every replica
selects the same entries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from .options import RuleOptions
from .rule import Init, ReplicaRule


def stage_buffers(copy) -> list[Tensor]:
    """The floating-point buffers of a stage copy (batch-norm running statistics)."""
    return [b for b in copy.stage.buffers() if b.is_floating_point()]


def draw_generator(seed: int, step: int, stage: int) -> torch.Generator:
    """The generator of one (seed, step, stage): the same draws on every replica and rank."""
    mixed = (int(seed) * 0x9E3779B1 + int(stage) * 0x85EBCA77 + int(step) * 0xC2B2AE3D) % (2**63 - 1)
    return torch.Generator().manual_seed(mixed)


@dataclass(frozen=True)
class PopulationOptions(RuleOptions):
    """``init``: ``same`` (every replica starts from replica 0's initialisation, copied) or
    ``different`` (replica r >= 1 re-initialised from a generator of (seed, r), as
    :func:`reinitialise` does)."""

    init: Init = "same"


class Population(ReplicaRule):
    """A population rule: N models side by side; ``init`` (an option) says how they start."""

    Options = PopulationOptions  # a population's options are PopulationOptions, ``init`` among them
    needs_replicas = True  # one model alone is a plain run

    def __init__(self, **settings):
        super().__init__(**settings)
        self.init = self.options.init


def reinitialise(model, seed: int, replica: int) -> None:
    """Give ``model`` the fresh default initialisation of replica ``replica`` (every module's own
    ``reset_parameters``, batch-norm statistics included), drawn from a generator of (seed,
    replica): the same on every rank, whichever stages it holds."""
    state = torch.random.get_rng_state()
    torch.manual_seed(int(draw_generator(seed, -1, replica).initial_seed()))
    try:
        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
            if hasattr(module, "reset_running_stats"):
                module.reset_running_stats()
    finally:
        torch.random.set_rng_state(state)


class Independent(Population):
    """``independent``: the replicas never exchange anything (an ensemble of independent models)."""

    name = "independent"


def step_in_epoch(step: int, k: int, batches_per_epoch: float) -> int:
    """The index, counted from 0 in its epoch, of optimizer step ``step`` (0-based over the run): a
    step belongs to the epoch of its first minibatch (``step · k``), and an epoch's first step is
    the first whose first minibatch lies in it (where k divides the epoch: ``step mod B/k``)."""
    epoch = math.floor(step * k / batches_per_epoch)
    return step - math.ceil(epoch * batches_per_epoch / k)


@dataclass(frozen=True)
class PAPAOptions(PopulationOptions):
    rate: float = 0.01  # λ at the base learning rate
    every: int = 10  # steps between averagings
    scale_with_lr: bool = True  # λ = rate · lr / lr₀
    phase: Literal["petra", "official"] = "petra"  # which steps average (module docstring)

    def check(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"rate={self.rate!r} is not allowed; allowed: 0 <= rate <= 1")
        if self.every < 1:
            raise ValueError(f"every={self.every!r} is not allowed; allowed: an integer >= 1")


class PAPA(Population):
    """``papa``: every ``every`` steps, θ_i ← (1 − λ)·θ_i + λ·mean(θ), λ = ``rate``·lr/lr₀."""

    name = "papa"
    Options = PAPAOptions

    def strength(self, copy) -> float:
        group = copy.optimizer.param_groups[0]
        base = group.get("initial_lr", group["lr"])
        return self.options.rate * (group["lr"] / base if self.options.scale_with_lr and base else 1.0)

    def averages_after(self, copy) -> bool:
        """Does the population average after the step ``copy`` has just taken (number steps − 1)?"""
        step, every = copy.steps - 1, self.options.every
        if self.options.phase == "petra":
            return (step + 1) % every == 0
        return step_in_epoch(step, copy.k, copy.batches_per_epoch) % every == 0

    def after_step(self, copies: Sequence, group) -> None:
        if group.size == 1 or not self.averages_after(copies[0]):
            return
        with torch.no_grad():
            states = [[*c.params, *stage_buffers(c)] for c in copies]
            flats = [torch.cat([t.detach().reshape(-1) for t in state]) for state in states]
            means = [f.clone() for f in flats]
            group.all_reduce_mean(means)()
            for copy, state, mean in zip(copies, states, means):
                lam = self.strength(copy)
                offset = 0
                for t in state:
                    n = t.numel()
                    target = mean[offset : offset + n].view(t.shape).to(t.dtype)
                    t.mul_(1.0 - lam).add_(target, alpha=lam)
                    offset += n


@dataclass(frozen=True)
class WASHOptions(PopulationOptions):
    p: float = 0.01  # the first parameter tensor's probability of being shuffled
    momentum: bool = True  # move the optimizer's momentum buffers with their weights

    def check(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"p={self.p!r} is not allowed; allowed: 0 <= p <= 1")


class WASH(Population):
    """``wash``: after every step, shuffle a layer-aware random fraction of the scalars between the
    replicas (``p``: the first tensor's probability; ``momentum``: move the optimizer's momentum
    buffers with their weights)."""

    name = "wash"
    Options = WASHOptions

    @staticmethod
    def probability(p: float, k: int, K: int) -> float:
        """p_k of parameter tensor k of K (network order): p at the first, 0 at the last."""
        return p if K <= 1 else p * (1.0 - k / (K - 1))

    def selection(self, copy, step: int, replicas: int) -> list[tuple[int, Tensor, Tensor]]:
        """(local tensor index, selected flat positions, permutations (n, R)) of ``copy``'s stage at
        ``step``: what every replica of the stage draws alike."""
        g = draw_generator(self.seed, step, copy.index)
        out = []
        for i, p in enumerate(copy.params):
            pk = self.probability(self.options.p, copy.tensor_offset + i, copy.tensors_total)
            chosen = (torch.rand(p.numel(), generator=g) < pk).nonzero().flatten()
            if chosen.numel():
                out.append((i, chosen, torch.rand(chosen.numel(), replicas, generator=g).argsort(1)))
        return out

    def after_step(self, copies: Sequence, group) -> None:
        if group.size == 1 or self.options.p == 0.0:
            return
        selected = self.selection(copies[0], copies[0].steps - 1, group.size)  # the step just taken
        if not selected:
            return
        device = copies[0].params[0].device
        with torch.no_grad():
            tensors = [self._tensors(c) for c in copies]  # per copy, per parameter: weight (and momentum)
            kinds = len(tensors[0][0])
            # positions in logical (row-major) order, as coordinates: the same scalar in every replica
            # and in its momentum, whatever their memory formats (channels-last weights)
            index = [
                (i, torch.unravel_index(chosen.to(device), copies[0].params[i].shape), perms.to(device))
                for i, chosen, perms in selected
            ]
            # one gather per stage and step: every selected scalar (and its momentum), in a fixed order
            values = [
                torch.cat([tensors[c][i][w][at] for i, at, _ in index for w in range(kinds)])
                for c in range(len(copies))
            ]
            everyone = group.all_gather(values)()  # (R, n)
            for c, copy in enumerate(copies):
                offset = 0
                for i, at, perms in index:
                    source = perms[:, copy.replica]  # replica r takes scalar j from replica source[j]
                    n = source.numel()
                    for w in range(kinds):
                        cols = torch.arange(offset, offset + n, device=device)
                        tensors[c][i][w][at] = everyone[source, cols]
                        offset += n

    def _tensors(self, copy) -> list[list[Tensor]]:
        """Per parameter: [the weight], or [the weight, its momentum buffer] when momenta move (a
        parameter without one yet, before the first step, moves a zero buffer: SGD's)."""
        out = []
        momentum = self.options.momentum and copy.optimizer.param_groups[0].get("momentum", 0) > 0
        for p in copy.params:
            row = [p.data]
            if momentum:
                state = copy.optimizer.state[p]
                if state.get("momentum_buffer") is None:
                    state["momentum_buffer"] = torch.zeros_like(p)
                row.append(state["momentum_buffer"])
            out.append(row)
        return out
