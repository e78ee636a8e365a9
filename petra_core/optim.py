"""Per-stage optimizer and learning-rate schedule (the paper's recipe, from torch.optim).

* SGD with Nesterov momentum (or AdamW, ACCO's optimizer: ``optimizer="adamw"``, betas and epsilon
  from the recipe, 0.9, 0.999 and 1e-8 by default; ACCO's official configuration uses β2 = 0.95);
  no weight decay on batch-norm parameters or any bias (every parameter with fewer than two
  dimensions) unless ``decay_1d`` (the official CDP, PAPA and ACCO codes decay every parameter;
  docs/conventions.md).
* Goyal et al. linear scaling: lr = base_lr · batch · k / 256.
* Linear warm-up advanced at every optimizer step (one step = k minibatches), then ×gamma at
  milestone epochs: ``LinearLR`` chained with ``MultiStepLR``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.optim.lr_scheduler import ChainedScheduler, LinearLR, LRScheduler, MultiStepLR


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

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r} is not allowed; allowed: {', '.join(OPTIMIZERS)}")
        betas = tuple(self.betas)
        if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas={self.betas!r} is not allowed; allowed: two numbers in [0, 1)")
        object.__setattr__(self, "betas", tuple(float(b) for b in betas))
        if not self.eps > 0.0:
            raise ValueError(f"eps={self.eps!r} is not allowed; allowed: a number > 0")

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


def make_optimizer(
    module: nn.Module, recipe: Recipe, *, batch_size: int, k: int, steps_per_epoch: float
) -> tuple[torch.optim.Optimizer, LRScheduler]:
    """The optimizer (SGD or AdamW) + schedule for one stage. ``steps_per_epoch`` counts optimizer
    steps (minibatches / k)."""
    lr = recipe.lr(batch_size, k)
    groups = param_groups(module.named_parameters(), recipe.weight_decay, decay_1d=recipe.decay_1d)
    if not groups:  # a stage without parameters (never happens for our models, but stay total)
        groups = [{"params": [nn.Parameter(torch.zeros(0))], "weight_decay": 0.0}]
    if recipe.optimizer == "adamw":
        opt = OPTIMIZERS["adamw"].build(groups, lr=lr, betas=recipe.betas, eps=recipe.eps)
    else:
        opt = OPTIMIZERS["sgd"].build(
            groups, lr=lr, momentum=recipe.momentum, nesterov=recipe.nesterov and recipe.momentum > 0
        )
    schedulers: list[LRScheduler] = []
    warmup = round(recipe.warmup_epochs * steps_per_epoch)
    if warmup > 1:  # lr(s) = peak · (s + 1) / warmup for s < warmup
        schedulers.append(LinearLR(opt, start_factor=1.0 / warmup, end_factor=1.0, total_iters=warmup - 1))
    milestones = sorted(round(m * steps_per_epoch) for m in recipe.milestones)
    schedulers.append(MultiStepLR(opt, milestones=milestones, gamma=recipe.gamma))
    return opt, ChainedScheduler(schedulers, optimizer=opt)
