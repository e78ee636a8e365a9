"""The replica-rule contract, the exchange of mean gradients, and the first rule, data parallelism.

The rules are listed by name in ``registry.py``. The runner holds, for every stage, the copies of
it that this process owns: all R of them in the simulator, one on a rank of a distributed run.
A copy's step goes through the rule in three calls:

1. ``contribute(copy, group)``: the copy has accumulated its k backward passes for step
   ``copy.steps``; the rule takes what the replicas exchange (``dp``: the gradient, into
   :class:`Exchanges`, whose all-reduce starts once every local copy has given its part);
2. ``ready(copy, group)``: may the copy step now, at the end of this tick? (``dp``: once the mean
   is there and the group does not overlap its collectives with compute.) A copy that is not
   ready steps right before its next forward or backward, or before anyone reads its weights;
3. ``complete(copy, group)``: wait for what the copy needs and set the gradient it steps with;
   False skips the update (weights and optimizer state stay, the learning-rate schedule advances).

Then the copy's optimizer steps, and once every local copy of the stage has stepped,
``after_step(copies, group)`` runs (the hook for rules that exchange weights); rules that step
sharded optimizers (``acco.py``) swap weight versions in ``before_forward`` and ``settle``. What a
rule remembers between steps is in its ``state_dict`` (checkpoints resume exactly).

A rule never sees the world, only :class:`ReplicaGroup`: collectives over the R copies of one
stage. In one process the group combines the local copies itself; on torch.distributed it is the
replica axis of the device mesh. Both sum in replica order, so for R = 2 (a sum of two terms is
exact in either order) the simulator and the ranks give the same bits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar, Literal, Protocol

import torch
from torch import Tensor, nn

from ..methods.schedule import Schedule
from .options import RuleOptions, build_options


class StageCopy(Protocol):
    """What a rule may read and change of one replica's copy of a stage (a ``StageWorker``)."""

    index: int  # the stage
    num_stages: int  # of the model
    replica: int  # the replica this copy belongs to
    stage: nn.Module
    params: list[nn.Parameter]
    optimizer: torch.optim.Optimizer
    steps: int  # optimizer steps taken so far: the step being prepared is number ``steps``
    k: int  # backward passes per step; ``pending`` of them are done
    batches_per_epoch: float | None  # each replica's minibatches per epoch (None: not told)
    tensor_offset: int  # the stage's first parameter tensor among the model's (network order), of
    tensors_total: int  # the model's


class ReplicaGroup(Protocol):
    """Collectives over the R copies of one stage; ``tensors`` holds one tensor per copy this
    process holds (``local`` of them), in replica order."""

    size: int  # R, the number of replicas
    local: int  # copies in this process (R in the simulator, 1 on a rank)
    overlaps: bool  # do its collectives run while this process computes (complete them late)?

    floats_sent: int  # floats each replica has put into the group's collectives so far

    def all_reduce_mean(self, tensors: list[Tensor]) -> Callable[[], None]:
        """Start replacing every tensor, in place, by the mean over all R copies; returns the wait."""
        ...

    def all_gather(self, tensors: list[Tensor]) -> Callable[[], Tensor]:
        """Start gathering the R copies' tensors (one shape); the wait returns them stacked, (R, ...)."""
        ...

    def reduce_scatter_mean(self, tensors: list[Tensor]) -> Callable[[], list[Tensor]]:
        """Start the mean of flat R·S floats over the R copies; the wait gives each copy r slice r."""
        ...


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
        value = flat[offset : offset + n].view(p.shape)
        if p.grad is None:
            p.grad = value.clone(memory_format=torch.preserve_format)
        else:
            p.grad.copy_(value)
        offset += n


class Exchanges:
    """The mean of the copies' gradients for each (stage, step), over the R replicas.

    A copy gives its flat gradient with :meth:`give`; when every copy this process holds has given
    its part, the all-reduce starts. :meth:`mean` waits for it. The last ``keep`` steps of each
    stage are kept (a rule that applies a mean one step late reads the previous one)."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self.parts: dict[tuple[int, int], dict[int, Tensor]] = {}  # (stage, step) -> replica -> flat
        self.waits: dict[tuple[int, int], Callable[[], None]] = {}  # launched, not yet waited for
        self.done: set[tuple[int, int]] = set()  # the parts hold the mean

    def give(self, copy: StageCopy, group: ReplicaGroup) -> None:
        key = (copy.index, copy.steps)
        parts = self.parts.setdefault(key, {})
        parts[copy.replica] = flat_grads(copy.params)
        if len(parts) == group.local:
            self.waits[key] = (
                group.all_reduce_mean([parts[r] for r in sorted(parts)]) if group.size > 1 else no_exchange
            )
            for old in [k for k in self.parts if k[0] == copy.index and k[1] <= copy.steps - self.keep]:
                self.parts.pop(old)
                self.waits.pop(old, None)
                self.done.discard(old)

    def launched(self, stage: int, step: int) -> bool:
        return (stage, step) in self.waits or (stage, step) in self.done

    def mean(self, stage: int, step: int, replica: int) -> Tensor:
        """The mean gradient of ``stage``'s step ``step`` (as ``replica`` holds it); waits for it."""
        key = (stage, step)
        if not self.launched(stage, step):
            raise RuntimeError(
                f"stage {stage}: the mean gradient of step {step} is needed before every replica has "
                f"given its part (a cyclic offset this rule cannot absorb: a real system would stall)"
            )
        if key in self.waits:
            self.waits.pop(key)()
            self.done.add(key)
        return self.parts[key][replica]

    def state_dict(self) -> dict:
        if any(key not in self.waits and key not in self.done for key in self.parts):
            raise RuntimeError("a checkpoint in the middle of an exchange (some replicas have not given their part)")
        for key in list(self.waits):
            self.waits.pop(key)()
            self.done.add(key)
        return {key: {r: t.detach().cpu() for r, t in parts.items()} for key, parts in self.parts.items()}

    def load_state_dict(self, state: dict) -> None:
        self.parts = {key: dict(parts) for key, parts in state.items()}
        self.waits, self.done = {}, set(self.parts)

    def to(self, device) -> None:
        self.parts = {key: {r: t.to(device) for r, t in parts.items()} for key, parts in self.parts.items()}


Init = Literal["same", "different"]  # how a rule's replicas start: replica 0's weights copied, or each its own


class ReplicaRule:
    """The rule of a single replica: nothing crosses replicas. Subclasses override the hooks.

    What a rule takes and needs is declared here, as class attributes, never guessed from its
    constructor: the engine, ``get_rule`` and the run's configuration read these and nothing else.
    A rule is built as ``Rule(stages=L, seed=s, **options)``; the options must be fields of
    ``Options``."""

    name: ClassVar[str] = "none"
    Options: ClassVar[type[RuleOptions]] = RuleOptions  # the settings it accepts (config: rule_options)
    staged: ClassVar[bool] = False  # takes ``stages``, the groups L of a cyclic delay (config: rule_stages)
    schedules: ClassVar[tuple[type[Schedule], ...] | None] = None  # the schedule types it runs on (None: any)
    needs_replicas: ClassVar[bool] = False  # meaningless with one replica: refused with R = 1
    same_weights: ClassVar[bool] = False  # replicas hold the same weights by construction (no population to evaluate)
    init: Init = "same"  # same: every replica starts from replica 0's weights

    def __init__(self, *, stages: int | None = None, seed: int = 0, **options):
        if stages is not None and not self.staged:
            raise ValueError(
                f"replica rule {self.name!r} takes no stage groups (stages={stages!r}); only a staged rule does"
            )
        self.stages = stages  # a staged rule's groups L (None: one per stage of the model)
        self.options = build_options(self.name, self.Options, options)
        self.seed = int(seed)  # the run's: rules that draw at random, or re-initialise replicas, draw from it

    def check(self, *, schedule: type[Schedule], k: int) -> None:
        """Raise ValueError (one line) if the rule cannot run on this schedule type or accumulation k."""
        if self.schedules is not None and not issubclass(schedule, self.schedules):
            raise ValueError(
                f"replica rule {self.name!r} runs on the {' or '.join(s.name for s in self.schedules)} schedule; "
                f"the method's is {schedule.name!r} (use a method of that schedule)"
            )

    def check_mesh(self, *, stages: int, replicas: int) -> None:
        """Raise ValueError (one line) if the rule cannot run on a model of ``stages`` stages with
        ``replicas`` replicas."""
        if self.needs_replicas and replicas < 2:
            raise ValueError(
                f"replica rule {self.name!r} is meaningless with replicas={replicas} (it is what replicas "
                f"do to each other); use replicas >= 2, or replica rule 'dp' for a single model"
            )

    def before_forward(self, copy: StageCopy, group: ReplicaGroup) -> None:
        """Right before ``copy``'s forward (a rule that computes at another version of the weights)."""

    def settle(self, copy: StageCopy, group: ReplicaGroup) -> None:
        """Before anyone reads ``copy``'s weights (evaluation, run files, checkpoints)."""

    def close(self) -> None:
        """Release what the rule runs (a communication thread)."""

    def contribute(self, copy: StageCopy, group: ReplicaGroup) -> None:
        """``copy`` has accumulated the gradient of its step ``copy.steps``: take what is exchanged."""

    def ready(self, copy: StageCopy, group: ReplicaGroup) -> bool:
        """May ``copy`` step now, at the end of the tick, without waiting?"""
        return True

    def complete(self, copy: StageCopy, group: ReplicaGroup) -> bool:
        """Wait for what ``copy`` needs and set the gradient it steps with; False: skip the update."""
        return True

    def after_step(self, copies: Sequence[StageCopy], group: ReplicaGroup) -> None:
        """After every local copy of the stage has taken the same step (weight exchanges, ...)."""

    def state_dict(self) -> dict:
        """What the rule remembers between steps (for this process's copies)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def to(self, device) -> None:
        """Move what the rule remembers to ``device`` (after loading a checkpoint)."""

    def __repr__(self) -> str:
        settings = [("stages", self.stages)] if self.staged else []
        settings += self.options.items()
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in settings)})"


class DataParallel(ReplicaRule):
    """``dp``: every copy steps with the mean of the R replicas' gradients (one flat all-reduce per
    stage and step); the weights stay identical, each keeps its own batch-norm statistics."""

    name = "dp"

    def __init__(self, **settings):
        super().__init__(**settings)
        self.exchanges = Exchanges(keep=1)

    def contribute(self, copy, group) -> None:
        if group.size > 1:
            self.exchanges.give(copy, group)

    def ready(self, copy, group) -> bool:
        return group.size == 1 or (self.exchanges.launched(copy.index, copy.steps) and not group.overlaps)

    def complete(self, copy, group) -> bool:
        if group.size > 1:
            set_grads(copy.params, self.exchanges.mean(copy.index, copy.steps, copy.replica))
        return True
