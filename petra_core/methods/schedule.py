"""Schedules as action tables: per tick and per stage, what a stage does.

J stages (0-based stage j), n minibatches, tick t. Every schedule here shares the engine's one
convention: a minibatch entering stage 0 at tick s is forwarded by stage j at s + j, and the
head (j = J − 1) runs its forward, loss and backward in one tick; its gradient then goes down
one stage per tick. The fill/drain of that round trip, 2(J − 1) ticks from stage 0's forward to
its backward, is :func:`fill_drain`; everything else is read off the table:

* :class:`Pipelined` (delayed, dsp, petra): minibatch m enters at tick m, so stage j runs the
  forward of t − j and the backward of t − 2(J−1) + j, and sees the gradient of a minibatch
  2(J−1−j) ticks after its forward (its staleness), while it stepped in between.
* :class:`OneFOneB` (PipeDream-Flush): the same within a group of k microbatches (warm-up
  forwards, then one forward and one backward a tick, cool-down backwards), then the pipeline is
  flushed and every stage steps once; the next group enters after the flush.
* :class:`Sequential` (backprop, revbackprop, the local methods): 1F1B with one minibatch per
  flush: minibatch m occupies ticks [m·P, (m+1)·P) with P = 2J − 1.
* :class:`GPipe`: per group of k microbatches, every stage runs all its forwards, then all its
  backwards (in forward order, so gradients accumulate in backprop's order). The head's
  gradients wait at stage J − 2 until its forwards are done; every other message is consumed the
  tick after it is sent.

Within a tick a stage's forward and backward use the same weights; a stage whose action says
``step`` applies its accumulated gradient at the end of the tick (after k backwards, or the last).
The runner (one process or many), the transport, the accounting and ``petra schedule`` read this
module; ``tests/test_schedule.py`` checks it in closed form.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

FORWARD, BACKWARD = "forward", "backward"


def fill_drain(num_stages: int) -> int:
    """Ticks from a minibatch's forward at stage 0 to its backward there, the head doing forward,
    loss and backward in one tick: 2(J − 1). The one place this formula is written."""
    return 2 * (num_stages - 1)


def staleness(num_stages: int, stage: int) -> int:
    """Ticks between a minibatch's forward and backward at 0-based ``stage`` of a pipelined schedule:
    2(J - 1 - stage), the paper's 2(J - j) for 1-based j."""
    return fill_drain(num_stages) - 2 * stage


@dataclass(frozen=True)
class Message:
    """A message in the table: ``direction`` (forward: an activation up; backward: a gradient
    down), the minibatch, and ``peer``, the stage it goes to (a send) or comes from (a receive)."""

    direction: str
    mb: int
    peer: int


@dataclass(frozen=True)
class Action:
    """What one stage does in one tick: minibatch ids (None: idle slot), whether it steps at the
    end of the tick, and the messages it consumes and sends (assuming gradients cross stages)."""

    forward: int | None
    backward: int | None
    step: bool = False
    receives: tuple[Message, ...] = ()
    sends: tuple[Message, ...] = ()

    @property
    def busy(self) -> bool:
        """Does the stage compute anything in this tick?"""
        return self.forward is not None or self.backward is not None


SCHEDULES: dict[str, type[Schedule]] = {}


def schedule_type(name: str) -> type[Schedule]:
    """The schedule type called ``name``."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; allowed: {', '.join(SCHEDULES)}")
    return SCHEDULES[name]


class _ByName(ABCMeta):
    """``Schedule("pipelined", J, n)`` builds the schedule type registered under that name."""

    def __call__(cls, *args, **kwargs):
        if cls is Schedule:
            if "kind" in kwargs:
                kind = kwargs.pop("kind")
            else:
                kind, *args = args
            return schedule_type(kind)(*args, **kwargs)
        return super().__call__(*args, **kwargs)


@dataclass(frozen=True)
class Schedule(metaclass=_ByName):
    """Per tick and per stage, the action of every stage (``action``, ``table``). ``k``: the
    accumulation (backwards per step; microbatches per flush for GPipe and 1F1B).

    Subclasses give the closed form: :meth:`_minibatches` (the forward and backward a stage runs
    at a tick), :meth:`forward_tick`, :meth:`backward_tick`, :attr:`num_ticks`, :meth:`flushed`."""

    num_stages: int
    num_batches: int
    k: int = 1

    name: ClassVar[str]
    fixed_weights_in_flight: ClassVar[bool]  # no weight moves between a minibatch's forward and its backward
    one_in_flight: ClassVar[bool] = False  # one minibatch in the whole pipeline at a time

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            SCHEDULES[cls.name] = cls

    def __post_init__(self):
        if self.num_stages < 1 or self.num_batches < 0:
            raise ValueError(f"need num_stages >= 1 and num_batches >= 0, got {self.num_stages}, {self.num_batches}")
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
            raise ValueError(f"accumulation k must be an integer >= 1, got {self.k!r}")

    # ---- what a subclass defines ----------------------------------------------------------------
    @property
    @abstractmethod
    def num_ticks(self) -> int:
        """Ticks until every minibatch has had its backward at every stage (pipeline drained)."""

    @abstractmethod
    def _minibatches(self, tick: int, stage: int) -> tuple[int | None, int | None]:
        """The minibatches ``stage`` runs the forward and the backward of at ``tick`` (None: idle)."""

    @abstractmethod
    def forward_tick(self, mb: int, stage: int) -> int:
        """The tick at which ``stage`` runs the forward of minibatch ``mb``."""

    @abstractmethod
    def backward_tick(self, mb: int, stage: int) -> int:
        """The tick at which ``stage`` runs the backward of minibatch ``mb``."""

    @abstractmethod
    def flushed(self, tick: int) -> bool:
        """Is no minibatch in flight at the end of ``tick`` (steps may wait for such a tick)?"""

    @abstractmethod
    def staleness(self, stage: int) -> int:
        """Ticks by which the weights of a backward at ``stage`` may be newer than its forward's."""

    @abstractmethod
    def in_flight(self, stage: int) -> int:
        """The most minibatches ``stage`` holds between forward and backward at a tick's end (given
        enough minibatches)."""

    # ---- the table --------------------------------------------------------------------------------
    def _valid(self, mb: int) -> int | None:
        return mb if 0 <= mb < self.num_batches else None

    def action(self, tick: int, stage: int) -> Action:
        J = self.num_stages
        if not 0 <= stage < J:
            raise ValueError(f"stage {stage} out of range 0..{J - 1}")
        f, b = self._minibatches(tick, stage)
        receives, sends = [], []
        if f is not None and stage > 0:
            receives.append(Message(FORWARD, f, stage - 1))
        if f is not None and stage < J - 1:
            sends.append(Message(FORWARD, f, stage + 1))
        if b is not None and stage < J - 1:
            receives.append(Message(BACKWARD, b, stage + 1))
        if b is not None and stage > 0:
            sends.append(Message(BACKWARD, b, stage - 1))
        step = b is not None and ((b + 1) % self.k == 0 or b == self.num_batches - 1)
        return Action(f, b, step, tuple(receives), tuple(sends))

    def busy(self, tick: int) -> list[int]:
        """The stages that compute anything at ``tick`` (the others are idle)."""
        return [j for j in range(self.num_stages) if self._minibatches(tick, j) != (None, None)]

    def table(self, max_ticks: int | None = None) -> list[list[Action]]:
        """table[t][j] = action of stage j at tick t (the first ``max_ticks`` ticks, or all)."""
        ticks = self.num_ticks if max_ticks is None else min(max_ticks, self.num_ticks)
        return [[self.action(t, j) for j in range(self.num_stages)] for t in range(ticks)]

    def bubble_fraction(self) -> float:
        """The share of (tick, stage) cells in which a stage computes nothing."""
        cells = self.num_ticks * self.num_stages
        return 1 - sum(len(self.busy(t)) for t in range(self.num_ticks)) / cells if cells else 0.0

    def format(self, max_ticks: int | None = None) -> str:
        """Printable table: one row per tick, ``F<m>/B<m>`` per stage (``.`` when idle); ``>`` after
        a forward whose activation goes up, ``<`` after a backward whose gradient goes down (both
        consumed by the neighbour when it runs that minibatch), ``*`` when the stage steps at the
        end of the tick."""

        def cell(a: Action) -> str:
            up, down = (any(m.direction == d for m in a.sends) for d in (FORWARD, BACKWARD))
            f = "." if a.forward is None else f"F{a.forward}" + (">" if up else "")
            b = "." if a.backward is None else f"B{a.backward}" + ("<" if down else "")
            return f"{f}/{b}" + ("*" if a.step else "")

        rows = [["tick", *[f"stage {j}" for j in range(self.num_stages)]]]
        rows += [[str(t), *map(cell, actions)] for t, actions in enumerate(self.table(max_ticks))]
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        return "\n".join("  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows)


class Pipelined(Schedule):
    """Minibatch m enters at tick m: forward of t − j and backward of t − 2(J−1) + j at stage j; the
    stage steps while minibatches are in flight (delayed gradients). Drained once, at the end."""

    name = "pipelined"
    fixed_weights_in_flight = False

    @property
    def num_ticks(self) -> int:
        return self.num_batches + fill_drain(self.num_stages) if self.num_batches else 0

    def _minibatches(self, tick: int, stage: int) -> tuple[int | None, int | None]:
        return self._valid(tick - stage), self._valid(tick - fill_drain(self.num_stages) + stage)

    def forward_tick(self, mb: int, stage: int) -> int:
        return mb + stage

    def backward_tick(self, mb: int, stage: int) -> int:
        return mb + fill_drain(self.num_stages) - stage

    def flushed(self, tick: int) -> bool:
        return tick == self.num_ticks - 1

    def staleness(self, stage: int) -> int:
        return staleness(self.num_stages, stage)

    def in_flight(self, stage: int) -> int:
        return staleness(self.num_stages, stage)

    def busy(self, tick: int) -> range:
        """A contiguous run of stages: the forward of tick − j is valid for tick − n < j <= tick, the
        backward of tick − 2(J−1) + j for 2(J−1) − tick <= j < 2(J−1) − tick + n; when both runs are
        non-empty they meet (a backward needs tick >= J − 1, where the forwards reach the head)."""
        J, N, D = self.num_stages, self.num_batches, fill_drain(self.num_stages)
        forward = range(max(0, tick - N + 1), min(J, tick + 1))
        backward = range(max(0, D - tick), min(J, D - tick + N))
        if not forward:
            return backward
        if not backward:
            return forward
        return range(min(forward.start, backward.start), max(forward.stop, backward.stop))


class _Flushed(Schedule):
    """Groups of :attr:`group_size` minibatches, each group drained (flushed) before the next
    enters, so no weight moves between a minibatch's forward and its backward. Within a group of s
    minibatches the i-th is forwarded at stage j at local tick j + i and backwarded at
    :meth:`_backward_start` (s, j) + i; a group lasts until stage 0's last backward."""

    fixed_weights_in_flight = True

    @cached_property
    def group_size(self) -> int:
        return self.k

    @abstractmethod
    def _backward_start(self, size: int, stage: int) -> int:
        """The local tick of the first of ``size`` minibatches' backward at ``stage``."""

    def _group_ticks(self, size: int) -> int:
        return self._backward_start(size, 0) + size

    @cached_property
    def period(self) -> int:
        """Ticks of a full group."""
        return self._group_ticks(self.group_size)

    @cached_property
    def num_ticks(self) -> int:
        full, rest = divmod(self.num_batches, self.group_size)
        return full * self.period + (self._group_ticks(rest) if rest else 0)

    def _local_table(self, size: int) -> tuple[list[tuple[tuple[int | None, int | None], ...]], list[list[int]]]:
        """A group of ``size`` minibatches, tick by local tick: each stage's (forward, backward)
        minibatch offsets within the group (None: idle), and the stages that act. Every group of a
        size has the same table, so it is made once (a runner reads it every tick: a lookup, not a
        recomputation per stage)."""
        table = self._tables.get(size)
        if table is None:
            J, ticks = self.num_stages, self._group_ticks(size)
            starts = [self._backward_start(size, j) for j in range(J)]
            offsets = [
                tuple(
                    ((local - j) if 0 <= local - j < size else None, (local - b) if 0 <= local - b < size else None)
                    for j, b in enumerate(starts)
                )
                for local in range(ticks)
            ]
            busy = [[j for j, fb in enumerate(row) if fb != (None, None)] for row in offsets]
            table = self._tables[size] = (offsets, busy)
        return table

    @cached_property
    def _tables(self) -> dict:
        return {}

    def _group(self, mb: int) -> tuple[int, int]:
        """(start tick, size) of the group of minibatch ``mb``."""
        g = mb // self.group_size
        return g * self.period, min(self.group_size, self.num_batches - g * self.group_size)

    def _locate(self, tick: int) -> tuple[int, int, int] | None:
        """(first minibatch, size, local tick) of the group running at ``tick``."""
        if not 0 <= tick < self.num_ticks:
            return None
        g, local = divmod(tick, self.period)
        first = g * self.group_size
        return first, min(self.group_size, self.num_batches - first), local

    def _minibatches(self, tick: int, stage: int) -> tuple[int | None, int | None]:
        where = self._locate(tick)
        if where is None:
            return None, None
        first, size, local = where
        f, b = self._local_table(size)[0][local][stage]
        return (None if f is None else first + f), (None if b is None else first + b)

    def busy(self, tick: int) -> list[int]:
        where = self._locate(tick)
        return [] if where is None else self._local_table(where[1])[1][where[2]]

    def forward_tick(self, mb: int, stage: int) -> int:
        start, _ = self._group(mb)
        return start + stage + mb % self.group_size

    def backward_tick(self, mb: int, stage: int) -> int:
        start, size = self._group(mb)
        return start + self._backward_start(size, stage) + mb % self.group_size

    def flushed(self, tick: int) -> bool:
        where = self._locate(tick)
        return where is not None and where[2] == len(self._local_table(where[1])[0]) - 1

    def staleness(self, stage: int) -> int:
        return 0


class OneFOneB(_Flushed):
    """PipeDream-Flush: per group of k microbatches, the pipelined table (a warm-up of 2(J−1−j)
    forward-only ticks at stage j, then one forward and one backward a tick, then the cool-down),
    then a flush: every stage steps once per group. Backwards run in forward order."""

    name = "1f1b"

    def _backward_start(self, size: int, stage: int) -> int:
        return fill_drain(self.num_stages) - stage

    def in_flight(self, stage: int) -> int:
        return min(self.group_size, staleness(self.num_stages, stage))


class Sequential(OneFOneB):
    """One minibatch in flight: 1F1B with one minibatch per flush. Minibatch m occupies ticks
    [m·P, (m+1)·P), P = 2J − 1; a stage steps after every k-th backward."""

    name = "sequential"
    one_in_flight = True

    @cached_property
    def group_size(self) -> int:
        return 1


class GPipe(_Flushed):
    """Per group of k microbatches every stage runs all its forwards, then all its backwards, in
    forward order (so gradients accumulate in the order backprop accumulates them), then steps
    once at the flush. The head runs forward, loss and backward in one tick, so its gradients
    wait at stage J − 2 until that stage's forwards are done; from there down each goes one stage
    a tick."""

    name = "gpipe"

    def _backward_start(self, size: int, stage: int) -> int:
        J = self.num_stages
        if stage == J - 1:
            return J - 1
        return (J - 2) + max(size, 2) + (J - 2 - stage)  # after stage J-2's last forward, then down a tick a stage

    def in_flight(self, stage: int) -> int:
        return 0 if stage == self.num_stages - 1 else self.group_size
