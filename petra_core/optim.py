"""Per-stage optimizer and learning-rate schedule (the paper's recipe, from torch.optim).

* SGD with Nesterov momentum (or AdamW, ACCO's optimizer: ``optimizer="adamw"``, betas and epsilon
  from the recipe, 0.9, 0.999 and 1e-8 by default; ACCO's official configuration uses β2 = 0.95);
  no weight decay on batch-norm parameters or any bias (every parameter with fewer than two
  dimensions) unless ``decay_1d`` (the official CDP, PAPA and ACCO codes decay every parameter;
  docs/conventions.md).
* Goyal et al. linear scaling: lr = base_lr · batch · k / 256.
* Linear warm-up, then ×gamma at milestone epochs (counted in the stage's optimizer steps). The
  warm-up's clock (``warmup_clock``): ``step`` (default) advances it at every optimizer step of
  the stage (one step = k minibatches), lr·(s + 1)/W with W in steps: ``LinearLR`` chained with
  ``MultiStepLR``. ``call`` is the authors' simulator's: one ramp for all stages, lr·(c + 1)/W
  with W in calls, a *call* being one minibatch entering the pipeline (their training loop feeds
  one minibatch per call and every layer steps in it); a stage's step takes the call of the tick
  its schedule steps it at (:class:`CallWarmup`), so the clock is a function of the step alone and
  the same in every world and after a resume.
* Or, after the warm-up, a cosine decay (``decay="cosine"``: nanoGPT's and minREV's recipes)
  from the peak down to ``final_lr_ratio`` · peak at ``decay_epochs`` (the run's last epoch), in
  the stage's optimizer steps: lr·(r + (1 − r)·(1 + cos(π·p))/2), p the fraction of the steps
  between the warm-up's end and ``decay_epochs`` gone by (a ``LambdaLR``). No milestones with it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.optim.lr_scheduler import ChainedScheduler, LambdaLR, LinearLR, LRScheduler, MultiStepLR


@dataclass(frozen=True)
class OptimizerKind:
    """An optimizer a recipe can name: its torch class and the options it is built with from the
    recipe (declared, so a copy of it — a ZeRO-1 shard's — is built with the same ones, and an
    option it does not take is refused before torch sees it)."""

    name: str
    cls: type[torch.optim.Optimizer]
    options: tuple[str, ...]  # the constructor's keyword options the recipe sets

    def build(self, groups: list[dict], **options) -> torch.optim.Optimizer:
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise ValueError(
                f"optimizer {self.name!r} has no option {unknown[0]!r}; allowed: {', '.join(self.options)}"
            )
        return self.cls(groups, **options)


OPTIMIZERS: dict[str, OptimizerKind] = {
    kind.name: kind
    for kind in (
        OptimizerKind("sgd", torch.optim.SGD, ("lr", "momentum", "nesterov")),
        OptimizerKind("adamw", torch.optim.AdamW, ("lr", "betas", "eps")),
    )
}


def kind_of(optimizer: torch.optim.Optimizer) -> OptimizerKind:
    """The declared kind of a built optimizer (one of :data:`OPTIMIZERS`)."""
    for kind in OPTIMIZERS.values():
        if type(optimizer) is kind.cls:
            return kind
    raise ValueError(
        f"optimizer {type(optimizer).__name__} is not declared; allowed: "
        f"{', '.join(k.cls.__name__ for k in OPTIMIZERS.values())} (petra_core/optim.py: OPTIMIZERS)"
    )


WARMUP_CLOCKS = ("step", "call")
DECAYS = ("step", "cosine")  # what follows the warm-up: x gamma at the milestones, or a cosine


@dataclass(frozen=True)
class Recipe:
    """Optimisation hyper-parameters shared by every stage."""

    base_lr: float = 0.1
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 5e-4
    warmup_epochs: float = 0.0
    milestones: tuple[float, ...] = ()
    gamma: float = 0.1
    scale_lr: bool = True  # Goyal scaling by batch · k / 256
    optimizer: str = "sgd"  # one of OPTIMIZERS
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW's (ACCO's official configuration: 0.9, 0.95)
    eps: float = 1e-8  # AdamW's
    decay_1d: bool = False  # decay parameters of one dimension or fewer too (biases, batch norm)
    warmup_clock: Literal["step", "call"] = "step"  # what the warm-up counts (module docstring)
    decay: Literal["step", "cosine"] = "step"  # after the warm-up (module docstring)
    decay_epochs: float = 0.0  # cosine: the epoch at which it reaches final_lr_ratio (the run's last)
    final_lr_ratio: float = 0.0  # cosine: the lr there over the peak (nanoGPT's Shakespeare recipe: 0.1)

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r} is not allowed; allowed: {', '.join(OPTIMIZERS)}")
        betas = tuple(self.betas)
        if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas={self.betas!r} is not allowed; allowed: two numbers in [0, 1)")
        object.__setattr__(self, "betas", tuple(float(b) for b in betas))
        if not self.eps > 0.0:
            raise ValueError(f"eps={self.eps!r} is not allowed; allowed: a number > 0")
        if self.warmup_clock not in WARMUP_CLOCKS:
            raise ValueError(f"warmup_clock={self.warmup_clock!r} is not allowed; allowed: {', '.join(WARMUP_CLOCKS)}")
        if self.decay not in DECAYS:
            raise ValueError(f"decay={self.decay!r} is not allowed; allowed: {', '.join(DECAYS)}")
        if not 0.0 <= self.final_lr_ratio <= 1.0:
            raise ValueError(f"final_lr_ratio={self.final_lr_ratio!r} is not allowed; allowed: a number in [0, 1]")
        if self.decay == "cosine":
            if self.milestones:
                raise ValueError(
                    f"milestones={list(self.milestones)!r} with decay='cosine'; allowed: no milestones (the "
                    f"cosine decays every step)"
                )
            if self.warmup_clock != "step":
                raise ValueError("decay='cosine' needs warmup_clock='step' (the call clock ramps in minibatches)")
            if not self.decay_epochs > self.warmup_epochs:
                raise ValueError(
                    f"decay_epochs={self.decay_epochs!r} is not allowed with decay='cosine'; allowed: more than "
                    f"warmup_epochs ({self.warmup_epochs!r}), the run's epochs"
                )

    def lr(self, batch_size: int, k: int) -> float:
        return self.base_lr * batch_size * k / 256 if self.scale_lr else self.base_lr


def param_groups(
    params: Iterable[tuple[str, nn.Parameter]], weight_decay: float, *, decay_1d: bool = False
) -> list[dict]:
    """Split parameters into decayed (conv/linear weights; with ``decay_1d`` every parameter, as the
    official CDP, PAPA and ACCO codes do) and not decayed (BN, biases)."""
    decay, no_decay = [], []
    for _, p in params:
        (decay if decay_1d or p.ndim > 1 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


class CallWarmup:
    """The ``call`` warm-up clock: at the stage's step s, lr = peak · min(1, (c + 1)/W) · gamma^(the
    milestones ≤ s), c = ``call_of_step(s)`` the call the stage's schedule steps it in and W the
    warm-up in calls. A scheduler as the worker uses one: ``step()`` after each optimizer step (the
    lr of the next is set then), ``state_dict``/``load_state_dict`` (the step count)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        warmup_calls: int,
        milestones: list[int],
        gamma: float,
        call_of_step: Callable[[int], int],
    ):
        self.optimizer, self.warmup, self.gamma = optimizer, warmup_calls, gamma
        self.milestones, self.call_of_step = sorted(milestones), call_of_step
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.last_step = 0
        self._set()

    def factor(self, step: int) -> float:
        warm = min(1.0, (self.call_of_step(step) + 1) / self.warmup) if self.warmup > 1 else 1.0
        return warm * self.gamma ** bisect.bisect_right(self.milestones, step)

    def _set(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * self.factor(self.last_step)

    def step(self) -> None:
        self.last_step += 1
        self._set()

    def state_dict(self) -> dict:
        return {"last_step": self.last_step}

    def load_state_dict(self, state: dict) -> None:
        self.last_step = state["last_step"]
        self._set()


def make_optimizer(
    module: nn.Module,
    recipe: Recipe,
    *,
    batch_size: int,
    k: int,
    steps_per_epoch: float,
    call_of_step: Callable[[int], int] | None = None,
    params: Iterable[tuple[str, nn.Parameter]] | None = None,
) -> tuple[torch.optim.Optimizer, LRScheduler | CallWarmup]:
    """The optimizer (SGD or AdamW) + schedule for one stage. ``steps_per_epoch`` counts optimizer
    steps (minibatches / k); ``call_of_step`` (``warmup_clock="call"`` only): the call (minibatch
    entering the pipeline, 0-based) of each of the stage's steps; ``params``: the named parameters
    it updates (default: all of ``module``'s)."""
    lr = recipe.lr(batch_size, k)
    named = module.named_parameters() if params is None else params
    groups = param_groups(named, recipe.weight_decay, decay_1d=recipe.decay_1d)
    if not groups:  # a stage without parameters (never happens for our models, but stay total)
        groups = [{"params": [nn.Parameter(torch.zeros(0))], "weight_decay": 0.0}]
    if recipe.optimizer == "adamw":
        opt = OPTIMIZERS["adamw"].build(groups, lr=lr, betas=recipe.betas, eps=recipe.eps)
    else:
        opt = OPTIMIZERS["sgd"].build(
            groups, lr=lr, momentum=recipe.momentum, nesterov=recipe.nesterov and recipe.momentum > 0
        )
    return opt, make_schedule(opt, recipe, k=k, steps_per_epoch=steps_per_epoch, call_of_step=call_of_step)


def make_schedule(
    opt: torch.optim.Optimizer,
    recipe: Recipe,
    *,
    k: int,
    steps_per_epoch: float,
    call_of_step: Callable[[int], int] | None = None,
) -> LRScheduler | CallWarmup:
    """The recipe's learning-rate schedule on ``opt`` (warm-up, then ×gamma at the milestones; the
    module docstring): what :func:`make_optimizer` gives each stage's optimizer, for any other
    torch optimizer too (benchmarks/delay_sensitivity.py's Muon)."""
    milestones = sorted(round(m * steps_per_epoch) for m in recipe.milestones)
    if recipe.warmup_clock == "call":
        if call_of_step is None:
            raise ValueError("warmup_clock='call' needs call_of_step (the call of each of the stage's steps)")
        calls = round(recipe.warmup_epochs * steps_per_epoch * k)  # an epoch's minibatches
        return CallWarmup(opt, warmup_calls=calls, milestones=milestones, gamma=recipe.gamma, call_of_step=call_of_step)
    if recipe.decay == "cosine":
        return LambdaLR(opt, cosine_factor(recipe, steps_per_epoch))
    schedulers: list[LRScheduler] = []
    warmup = round(recipe.warmup_epochs * steps_per_epoch)
    if warmup > 1:  # lr(s) = peak · (s + 1) / warmup for s < warmup
        schedulers.append(LinearLR(opt, start_factor=1.0 / warmup, end_factor=1.0, total_iters=warmup - 1))
    schedulers.append(MultiStepLR(opt, milestones=milestones, gamma=recipe.gamma))
    return ChainedScheduler(schedulers, optimizer=opt)


def cosine_factor(recipe: Recipe, steps_per_epoch: float) -> Callable[[int], float]:
    """lr(s) / peak of the cosine recipe at the stage's step s: the warm-up's linear ramp, then the
    cosine down to ``final_lr_ratio`` at ``decay_epochs``, flat after it."""
    warmup = round(recipe.warmup_epochs * steps_per_epoch)
    end = max(round(recipe.decay_epochs * steps_per_epoch), warmup + 1)
    floor = recipe.final_lr_ratio

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        done = min(1.0, (step - warmup) / (end - warmup))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * done))

    return factor
