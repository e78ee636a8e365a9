"""The delay schedule: a pure function (kind, tick, stage) -> which minibatches a stage runs.

Pipelined (delayed methods: delayed, dsp, petra), J stages, 0-based stage j, tick t:
    forward  of minibatch t − j
    backward of minibatch t − 2(J−1) + j
so stage j sees the gradient of a minibatch 2(J−1−j) ticks after its forward; the head (j = J−1)
does forward, loss and backward of the same minibatch in one tick.

Sequential (backprop, revbackprop) is the same pipeline with one minibatch in flight: minibatch m
occupies ticks [m·P, (m+1)·P) with P = 2J − 1, so no stage ever sees a stale weight.

The runner (in one process or many), the memory accounting and the tests all read this module.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("pipelined", "sequential")


def staleness(num_stages: int, stage: int) -> int:
    """Ticks between a minibatch's forward and backward at 0-based ``stage`` of a pipelined schedule:
    2(J - 1 - stage), the paper's 2(J - j) for 1-based j."""
    return 2 * (num_stages - 1 - stage)


@dataclass(frozen=True)
class Action:
    """What one stage does in one tick: minibatch ids, or None for an idle slot."""

    forward: int | None
    backward: int | None

    @property
    def busy(self) -> bool:
        """Does the stage compute anything in this tick?"""
        return self.forward is not None or self.backward is not None


@dataclass(frozen=True)
class Schedule:
    kind: str
    num_stages: int
    num_batches: int

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown schedule {self.kind!r}; allowed: {', '.join(KINDS)}")
        if self.num_stages < 1 or self.num_batches < 0:
            raise ValueError(f"need num_stages >= 1 and num_batches >= 0, got {self.num_stages}, {self.num_batches}")

    @property
    def period(self) -> int:
        """Ticks per minibatch in the sequential schedule."""
        return 2 * self.num_stages - 1

    @property
    def num_ticks(self) -> int:
        """Ticks until every minibatch has had its backward at every stage (pipeline drained)."""
        if self.num_batches == 0:
            return 0
        if self.kind == "sequential":
            return self.num_batches * self.period
        return self.num_batches + 2 * (self.num_stages - 1)

    def staleness(self, stage: int) -> int:
        """Ticks between a minibatch's forward and backward at ``stage``."""
        return staleness(self.num_stages, stage)

    def forward_tick(self, mb: int, stage: int) -> int:
        """The tick at which ``stage`` runs the forward of minibatch ``mb``."""
        return mb * self.period + stage if self.kind == "sequential" else mb + stage

    def backward_tick(self, mb: int, stage: int) -> int:
        """The tick at which ``stage`` runs the backward of minibatch ``mb``."""
        start = mb * self.period if self.kind == "sequential" else mb
        return start + 2 * (self.num_stages - 1) - stage

    def _valid(self, mb: int) -> int | None:
        return mb if 0 <= mb < self.num_batches else None

    def action(self, tick: int, stage: int) -> Action:
        J = self.num_stages
        if not 0 <= stage < J:
            raise ValueError(f"stage {stage} out of range 0..{J - 1}")
        if self.kind == "pipelined":
            return Action(self._valid(tick - stage), self._valid(tick - 2 * (J - 1) + stage))
        mb, offset = divmod(tick, self.period)
        return Action(
            self._valid(mb) if offset == stage else None,
            self._valid(mb) if offset == 2 * (J - 1) - stage else None,
        )

    def busy(self, tick: int) -> range:
        """The stages that compute anything at ``tick`` (the others are idle): a contiguous run,
        so a runner need not ask every stage of a sequential schedule, where one works per tick."""
        J, N = self.num_stages, self.num_batches
        if self.kind == "sequential":
            mb, offset = divmod(tick, self.period)
            if not 0 <= mb < N:
                return range(0)
            stage = offset if offset < J else 2 * (J - 1) - offset
            return range(stage, stage + 1)
        # the forward of tick - j is valid for tick - N < j <= tick, the backward of tick - 2(J-1) + j
        # for 2(J-1) - tick <= j < 2(J-1) - tick + N; when both runs are non-empty they meet (a
        # backward needs tick >= J - 1, where the forwards reach the last stage)
        forward = range(max(0, tick - N + 1), min(J, tick + 1))
        backward = range(max(0, 2 * (J - 1) - tick), min(J, 2 * (J - 1) - tick + N))
        if not forward:
            return backward
        if not backward:
            return forward
        return range(min(forward.start, backward.start), max(forward.stop, backward.stop))

    def table(self) -> list[list[Action]]:
        """table[t][j] = action of stage j at tick t."""
        return [[self.action(t, j) for j in range(self.num_stages)] for t in range(self.num_ticks)]

    def format(self, max_ticks: int | None = None) -> str:
        """Printable table: one row per tick, ``F<m>/B<m>`` per stage (``.`` when idle)."""
        ticks = self.num_ticks if max_ticks is None else min(max_ticks, self.num_ticks)

        def cell(a: Action) -> str:
            f = "." if a.forward is None else f"F{a.forward}"
            b = "." if a.backward is None else f"B{a.backward}"
            return f"{f}/{b}"

        rows = [["tick", *[f"stage {j}" for j in range(self.num_stages)]]]
        rows += [[str(t), *[cell(self.action(t, j)) for j in range(self.num_stages)]] for t in range(ticks)]
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        return "\n".join("  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows)
