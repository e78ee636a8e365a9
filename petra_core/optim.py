"""Per-stage optimizer and learning-rate schedule (the paper's recipe, from torch.optim).

* SGD with Nesterov momentum (or AdamW, ACCO's optimizer: ``optimizer="adamw"``, betas 0.9 and
  0.999, decoupled weight decay); no weight decay on batch-norm parameters or any bias (every
  parameter with fewer than two dimensions).
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
        OptimizerKind("adamw", torch.optim.AdamW, ("lr", "betas")),
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

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r} is not allowed; allowed: {', '.join(OPTIMIZERS)}")

    def lr(self, batch_size: int, k: int) -> float:
        return self.base_lr * batch_size * k / 256 if self.scale_lr else self.base_lr


def param_groups(params: Iterable[tuple[str, nn.Parameter]], weight_decay: float) -> list[dict]:
    """Split parameters into decayed (conv/linear weights) and not decayed (BN, biases)."""
    decay, no_decay = [], []
    for _, p in params:
        (decay if p.ndim > 1 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def make_optimizer(
    module: nn.Module, recipe: Recipe, *, batch_size: int, k: int, steps_per_epoch: float
) -> tuple[torch.optim.Optimizer, LRScheduler]:
    """The optimizer (SGD or AdamW) + schedule for one stage. ``steps_per_epoch`` counts optimizer
    steps (minibatches / k)."""
    lr = recipe.lr(batch_size, k)
    groups = param_groups(module.named_parameters(), recipe.weight_decay)
    if not groups:  # a stage without parameters (never happens for our models, but stay total)
        groups = [{"params": [nn.Parameter(torch.zeros(0))], "weight_decay": 0.0}]
    if recipe.optimizer == "adamw":
        opt = OPTIMIZERS["adamw"].build(groups, lr=lr, betas=(0.9, 0.999))
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
