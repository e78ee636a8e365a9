"""Cyclic Data Parallelism (Fournier & Oyallon, arXiv 2403.08837): ``cdp1`` and ``cdp2``.

In CDP the replicas' micro-batches start one after another with a uniform delay instead of all
at once, so a stage's gradients can be averaged while the next micro-batches already run, at the
price of a delay of one step for some (replica, stage) cells. As in the authors' public code
(``CDP.update``): gradients are all-reduced every step (the mean ḡ_t over the R replicas), then

* ``cdp1``: every stage steps with the previous step's mean ḡ_{t-1};
* ``cdp2``: stage l of replica r steps with ḡ_t if l ≥ L − 1 − r, else with ḡ_{t-1};

a cell that would use ḡ_{-1} (the first step) skips its update (the learning-rate schedule
still advances, as the authors' per-epoch scheduler does). r is the replica and l the stage's
group: the model's J stages cut into L contiguous groups (``stages=L``; sizes differ by at most
one, the larger first, like the authors' split by count; default L = J, one group per stage). Under
``cdp2`` the replicas' weights drift apart (replicas r ≥ L − 1 are pure DP), and each computes its gradient on its own
weights.

With a pipelined method (PETRA, DSP, delayed gradients) the two delays compose: the gradient a
stage accumulates for its step t already carries the method's own staleness (stage j's is
computed 2(J − 1 − j) ticks after its forward), and the cyclic rule then applies it one step
later where the rule says ḡ_{t-1}: a delayed cell of stage j steps with the mean of the
gradients its method produced for the previous group of k minibatches.
"""

from __future__ import annotations

from .rule import Exchanges, ReplicaRule, set_grads


class CyclicDataParallel(ReplicaRule):
    """The mean gradient of the replicas, applied now or one step late, cell by cell."""

    staged = True  # the L groups of stages the delay counts
    needs_replicas = True  # the cells of one replica alone are a delayed single model, not CDP

    def __init__(self, stages: int | None = None, **settings):
        if stages is not None and (not isinstance(stages, int) or isinstance(stages, bool) or stages < 1):
            raise ValueError(f"{self.name}: stages must be an integer >= 1 (the groups L), got {stages!r}")
        super().__init__(stages=stages, **settings)
        self.exchanges = Exchanges(keep=2)  # this step's mean and the previous one

    def check_mesh(self, *, stages: int, replicas: int) -> None:
        super().check_mesh(stages=stages, replicas=replicas)
        self.groups(stages)  # a bad number of groups: one line now, not at the first step

    def groups(self, num_stages: int) -> tuple[int, list[int]]:
        """L, and the group of each of the model's ``num_stages`` stages."""
        L = num_stages if self.stages is None else self.stages
        if num_stages < L:
            raise ValueError(f"{self.name}: stages={L} groups cannot be cut from a model of {num_stages} stages")
        size, extra = divmod(num_stages, L)
        return L, [g for g in range(L) for _ in range(size + (g < extra))]

    def delayed(self, replica: int, stage: int, num_stages: int) -> bool:
        """Does stage ``stage`` of replica ``replica`` step with the previous step's mean?"""
        L, group = self.groups(num_stages)
        return self.late(replica, group[stage], L)

    def late(self, replica: int, group: int, L: int) -> bool:
        raise NotImplementedError

    def contribute(self, copy, group) -> None:
        self.exchanges.give(copy, group)

    def ready(self, copy, group) -> bool:
        if self.delayed(copy.replica, copy.index, copy.num_stages):
            return copy.steps == 0 or self.exchanges.launched(copy.index, copy.steps - 1)
        return self.exchanges.launched(copy.index, copy.steps) and not group.overlaps

    def complete(self, copy, group) -> bool:
        step = copy.steps - 1 if self.delayed(copy.replica, copy.index, copy.num_stages) else copy.steps
        if step < 0:
            return False  # the first step of a late cell: nothing to apply yet
        set_grads(copy.params, self.exchanges.mean(copy.index, step, copy.replica))
        return True

    def state_dict(self) -> dict:
        return {"exchanges": self.exchanges.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.exchanges.load_state_dict(state.get("exchanges", {}))

    def to(self, device) -> None:
        self.exchanges.to(device)


class CDP1(CyclicDataParallel):
    """``cdp1``: every stage of every replica steps with ḡ_{t-1}."""

    name = "cdp1"

    def late(self, replica: int, group: int, L: int) -> bool:
        return True


class CDP2(CyclicDataParallel):
    """``cdp2``: stage l of replica r steps with ḡ_t if l ≥ L − 1 − r, else with ḡ_{t-1}."""

    name = "cdp2"

    def late(self, replica: int, group: int, L: int) -> bool:
        return group < L - 1 - replica
