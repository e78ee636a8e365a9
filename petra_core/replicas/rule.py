"""The replica-rule contract and its first rule, data parallelism (``dp``).

The rules are listed by name in ``registry.py``. The runner holds, for every stage, the copies of it that this process owns: all R of them in the
simulator, one on a rank of a distributed run. When a stage has accumulated its k backward
passes, the runner calls, for that stage, ``rule.launch(copies, group)`` (start the replicas'
traffic: an asynchronous collective), then ``finish()`` on what it returned (None, or one flag
per copy: does it take this step? a skipped step leaves the weights and the optimizer state as
they are, and still advances the learning-rate schedule), then every copy's optimizer step, then
``rule.after_step(copies, group)``. A rule that remembers something between steps saves it in
``state_dict`` (checkpoints resume exactly). The launches of every stage due in a tick
come before the first finish, so their collectives overlap.

A rule never sees the world, only :class:`ReplicaGroup`: collectives over the R copies of one
stage. In one process the group combines the local copies itself; on torch.distributed it is the
replica axis of the device mesh. Both sum in replica order, so for R = 2 (a sum of two terms is
exact in either order) the simulator and the ranks give the same bits.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import Tensor, nn


class StageCopy(Protocol):
    """What a rule may read and change of one replica's copy of a stage (a ``StageWorker``)."""

    index: int  # the stage
    num_stages: int  # of the model
    replica: int  # the replica this copy belongs to
    stage: nn.Module
    params: list[nn.Parameter]
    optimizer: torch.optim.Optimizer
    steps: int  # optimizer steps taken so far


class ReplicaGroup(Protocol):
    """Collectives over the R copies of one stage; ``tensors`` holds one tensor per local copy, in
    the order of the copies the rule was given."""

    size: int  # R, the number of replicas

    def all_reduce_mean(self, tensors: list[Tensor]) -> Callable[[], None]:
        """Start replacing every tensor, in place, by the mean over all R copies; returns the wait."""
        ...


Finish = Callable[[], "Sequence[bool] | None"]


class ReplicaRule:
    """The rule of a single replica: nothing crosses replicas. Subclasses override the hooks."""

    name = "none"

    def launch(self, copies: Sequence[StageCopy], group: ReplicaGroup) -> Finish:
        """After a stage's k-th backward, before its step: start what the replicas exchange; the
        returned callable completes it (the runner calls it before stepping)."""
        return no_exchange

    def after_step(self, copies: Sequence[StageCopy], group: ReplicaGroup) -> None:
        """After every copy of the stage has stepped (weight exchanges, averaging, ...)."""

    def state_dict(self) -> dict:
        """What the rule remembers between steps (for this process's copies)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def to(self, device) -> None:
        """Move what the rule remembers to ``device`` (after loading a checkpoint)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def no_exchange() -> None:
    """The completion of an exchange that sent nothing."""
    return None


def flat_grads(params: Sequence[nn.Parameter]) -> Tensor:
    """Every gradient of ``params`` in one flat buffer (zeros for a parameter without one)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def set_grads(params: Sequence[nn.Parameter], flat: Tensor) -> None:
    """Write a buffer of :func:`flat_grads` back into ``params``' gradients."""
    offset = 0
    for p in params:
        n = p.numel()
        value = flat[offset:offset + n].view(p.shape)
        if p.grad is None:
            p.grad = value.clone(memory_format=torch.preserve_format)
        else:
            p.grad.copy_(value)
        offset += n


class DataParallel(ReplicaRule):
    """``dp``: every copy steps with the mean of the R replicas' accumulated gradients (one flat
    all-reduce per stage and step). Replicas start identical and stay identical in their weights;
    each keeps its own batch-norm running statistics (from its own minibatches)."""

    name = "dp"

    def launch(self, copies: Sequence[StageCopy], group: ReplicaGroup) -> Finish:
        if group.size == 1:
            return no_exchange
        flats = [flat_grads(c.params) for c in copies]
        wait = group.all_reduce_mean(flats)

        def finish() -> None:
            wait()
            for c, flat in zip(copies, flats):
                set_grads(c.params, flat)

        return finish
