"""Modelled wall-clock of the sharded replica rules on a link: what a slow link costs DDP (ZeRO-1)
and what DPU and ACCO hide, from a run's measured compute.

The simulator runs the R replicas one after another, so its clock says nothing about the link. A
step's time on R devices joined by ``link`` is modelled from two things the records measure: a
replica's compute per step (``k`` micro-batches at the run's measured samples per second) and the
rule's rounds (``petra_core/replicas/acco.py``). A round reduce-scatters the flat gradient of P
floats and all-gathers the updated shards, each a ring: R − 1 hops of P / R floats, so a round
takes 2 (R − 1) (latency + 4 P / (R × bandwidth)). How the rounds meet the compute is the rule's:

* ``zero1`` (DDP's exact mean): step t + 1 needs step t's round: compute + round;
* ``dpu``: step t's round runs during step t + 1: max(compute, round);
* ``acco``: two rounds a step (the real one and the tentative one), each during one half of the
  step's micro-batches: 2 × max(compute / 2, round);
* ``wp``: one reduce-scatter and two all-gathers (θ and its prediction) during the next step:
  max(compute, round + one more all-gather).

A model, not a measurement of a cluster: no contention, no congestion, the ring's textbook cost. The
rounds per step it assumes are checked against the floats a simulated run counts
(``tests/test_replica_clock.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .cluster import Link, PlanError

FLOAT_BYTES = 4


@dataclass(frozen=True)
class RuleTiming:
    """How a rule's communication meets its compute: reduce-scatters and all-gathers per step, and
    the share of a step's compute each round may hide behind (0: none, it waits)."""

    reduce_scatters: int
    all_gathers: int
    hidden_behind: float  # the fraction of a step's compute one round overlaps

    def floats_counted(self, params: int, replicas: int) -> float:
        """The floats a replica's collectives count per step (``floats_sent_per_step`` of a run: a
        reduce-scatter counts the whole flat gradient, an all-gather the replica's own shard)."""
        return self.reduce_scatters * params + self.all_gathers * params / replicas


TIMINGS = {
    "zero1": RuleTiming(1, 1, 0.0),
    "dpu": RuleTiming(1, 1, 1.0),
    "acco": RuleTiming(2, 2, 0.5),
    "wp": RuleTiming(1, 2, 1.0),
}


def timing(rule: str) -> RuleTiming:
    if rule not in TIMINGS:
        raise PlanError(f"no wall-clock model for replica rule {rule!r}; allowed: {', '.join(TIMINGS)}")
    return TIMINGS[rule]


def ring_seconds(params: int, replicas: int, link: Link) -> float:
    """One ring collective (a reduce-scatter or an all-gather) over ``params`` floats."""
    if replicas < 2:
        return 0.0
    return (replicas - 1) * link.seconds(FLOAT_BYTES * params / replicas)


def step_seconds(rule: str, *, compute_s: float, params: int, replicas: int, link: Link) -> float:
    """One optimizer step of ``rule`` on ``replicas`` devices joined by ``link``, with ``compute_s``
    of compute per replica and step."""
    t = timing(rule)
    if compute_s < 0:
        raise PlanError(f"compute_s is {compute_s!r}; allowed: seconds >= 0")
    ring = ring_seconds(params, replicas, link)
    if t.hidden_behind == 0.0:
        return compute_s + (t.reduce_scatters + t.all_gathers) * ring
    rounds = t.reduce_scatters  # every all-gather belongs to a round that starts with a reduce-scatter
    per_round = (t.reduce_scatters + t.all_gathers) * ring / rounds
    return rounds * max(compute_s * t.hidden_behind, per_round)
