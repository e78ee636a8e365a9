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
one, the larger first, like the authors' split by count; default L = J, one group per stage). Under ``cdp2`` the replicas'
weights drift apart (replicas r ≥ L − 1 are pure DP), and each computes its gradient on its own
weights.

With a pipelined method (PETRA, DSP, delayed gradients) the two delays compose: the gradient a
stage accumulates for its step t already carries the method's own staleness (stage j's is
computed 2(J − 1 − j) ticks after its forward), and the cyclic rule then applies it one step
later where the rule says ḡ_{t-1}: a delayed cell of stage j steps with the mean of the
gradients its method produced for the previous group of k minibatches.
"""
from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from .rule import Finish, ReplicaGroup, ReplicaRule, StageCopy, no_exchange, flat_grads, set_grads


class CyclicDataParallel(ReplicaRule):
    """The mean gradient of the replicas, applied now or one step late, cell by cell."""

    def __init__(self, stages: int | None = None):
        if stages is not None and (not isinstance(stages, int) or isinstance(stages, bool) or stages < 1):
            raise ValueError(f"{self.name}: stages must be an integer >= 1 (the groups L), got {stages!r}")
        self.stages = stages
        self.previous: dict[tuple[int, int], Tensor] = {}  # (replica, stage) -> ḡ_{t-1} (delayed cells)

    def groups(self, num_stages: int) -> tuple[int, list[int]]:
        """L, and the group of each of the model's ``num_stages`` stages."""
        L = num_stages if self.stages is None else self.stages
        if L > num_stages:
            raise ValueError(f"{self.name}: stages={L} groups cannot be cut from a model of {num_stages} stages")
        size, extra = divmod(num_stages, L)
        return L, [g for g in range(L) for _ in range(size + (g < extra))]

    def delayed(self, replica: int, stage: int, num_stages: int) -> bool:
        """Does stage ``stage`` of replica ``replica`` step with the previous step's mean?"""
        L, group = self.groups(num_stages)
        return self.late(replica, group[stage], L)

    def late(self, replica: int, group: int, L: int) -> bool:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(stages={self.stages})"

    def launch(self, copies: Sequence[StageCopy], group: ReplicaGroup) -> Finish:
        flats = [flat_grads(c.params) for c in copies]
        wait = group.all_reduce_mean(flats) if group.size > 1 else no_exchange

        def finish() -> list[bool]:
            wait()
            applies = []
            for c, mean in zip(copies, flats):
                if not self.delayed(c.replica, c.index, c.num_stages):
                    set_grads(c.params, mean)
                    applies.append(True)
                    continue
                previous = self.previous.get((c.replica, c.index))
                self.previous[(c.replica, c.index)] = mean
                if previous is not None:
                    set_grads(c.params, previous)
                applies.append(previous is not None)
            return applies

        return finish

    def state_dict(self) -> dict:
        return {"previous": {key: t.detach().cpu() for key, t in self.previous.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.previous = dict(state.get("previous", {}))

    def to(self, device) -> None:
        self.previous = {key: t.to(device) for key, t in self.previous.items()}


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
