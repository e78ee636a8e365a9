"""The ranks of a distributed run kept in step (:class:`DistributedRanks`): the clock, the run's
own collectives and failure reports.

The collectives span the world in two gloo groups this part creates and owns: one bounded by
``timeout`` like every wait of the pipeline (the per-tick ``agree``), one generous (rank 0 may
prepare data or write a checkpoint while the others wait). A collective that breaks names the
rank that is gone by its mesh coordinate; a failure is published to every rank through
:class:`~petra_core.engine.distributed.failures.FailureWatch`, whose heartbeats start here.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from .failures import DEFAULT_TIMEOUT, FailureWatch, PipelineError, gone, is_timeout, short
from .placement import RankPlacement

CONTROL_TIMEOUT = 3600.0  # how long ranks wait for rank 0 (data preparation, evaluation, checkpoint writes)


class DistributedRanks:
    """Every rank of the process group, seen from ``placement``'s rank (collective to construct)."""

    def __init__(
        self, placement: RankPlacement, *, timeout: float = DEFAULT_TIMEOUT, control_timeout: float = CONTROL_TIMEOUT
    ):
        self.placement, self.timeout = placement, timeout
        self.rank, self.world_size = placement.rank, placement.world_size
        self.tick = 0  # where this rank is, for failure reports (begin_tick)
        self.tick_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))
        self.control = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=max(control_timeout, timeout)))
        self.watch = FailureWatch(self.rank, placement.describe, lambda: self.tick)
        if self.world_size > 1:
            self.watch.start()  # heartbeats from now on: a rank that dies even at start-up gets named

    # ---- the clock ------------------------------------------------------------------------------
    def begin_tick(self, tick: int) -> None:
        self.tick = tick
        if self.watch.failed is not None:
            raise PipelineError(self.watch.failed)

    def end_tick(self, tick: int) -> None:
        self.tick = tick + 1  # between ticks a rank is at the next one

    # ---- collectives ----------------------------------------------------------------------------
    def collective(self, what: str, fn: Callable):
        """``fn()``, a collective of every rank; if it breaks, name the rank that is gone."""
        try:
            return fn()
        except PipelineError:
            raise
        except Exception as err:  # noqa: BLE001
            silent = self.watch.silent_ranks(self.world_size)
            left = {r for r in silent if self.watch.left(r)}  # left on their own: stopped, not failed
            who, others = gone(
                [self.placement.name_rank(r) for r in silent if r not in left],
                [self.placement.name_rank(r) for r in silent if r in left],
                self.timeout if is_timeout(err) else None,
            )
            when = "" if "tick" in what else f" (tick {self.tick})"
            raise PipelineError(
                self.report(f"petra: {who} while {self.placement.describe()} was {what}{when} ({short(err)}){others}")
            ) from err

    def barrier(self, what: str) -> None:
        self.collective(what, lambda: dist.barrier(group=self.control))

    def gather_object(self, obj, dst: int = 0) -> list | None:
        out = [None] * self.world_size if self.rank == dst else None
        self.collective("gathering results", lambda: dist.gather_object(obj, out, dst=dst, group=self.control))
        return out

    def all_objects(self, obj) -> list:
        out: list = [None] * self.world_size
        self.collective("exchanging state", lambda: dist.all_gather_object(out, obj, group=self.control))
        return out

    def share(self, obj):
        """Rank 0's ``obj`` on every rank."""
        box = [obj]
        self.collective("sharing rank 0's state", lambda: dist.broadcast_object_list(box, src=0, group=self.control))
        return box[0]

    def all_true(self, flag: bool) -> bool:
        return all(self.all_objects(bool(flag)))

    def together(self, fn: Callable, errors: Sequence[type[BaseException]] = (ValueError,)):
        """Run ``fn`` on every rank; if it raises on any rank, raise on every rank (an error of one of
        the ``errors`` types keeps its type, so its one-line message reaches the user; an OSError
        keeps its errno and path, so every rank ends as a file error) — no rank is left waiting."""
        try:
            result, mine = fn(), None
        except Exception as err:  # noqa: BLE001 - handed to every rank
            result, mine = None, err
        reported = self.all_objects(None if mine is None else _portable(mine))
        if mine is not None:
            raise mine
        kinds = {e.__name__: e for e in errors}
        for r, e in enumerate(reported):
            if e is not None:
                if e[0] in kinds:
                    raise kinds[e[0]](e[1])
                if e[2] is not None:  # an OSError: the same errno and path on every rank
                    raise OSError(*e[2])
                raise RuntimeError(f"rank {r} failed: {e[0]}: {e[1]}")
        return result

    def on_main(self, fn: Callable, errors: Sequence[type[BaseException]] = (ValueError,)):
        """``fn()`` on rank 0 while the other ranks wait; a failure there stops every rank."""
        return self.together(fn if self.placement.is_main else lambda: None, errors)

    def agree(self, signal: str | None, diverged: str | None, tick: int) -> tuple[str | None, str | None]:
        """Every rank's verdict at the end of ``tick``: stop on a signal to any rank, or on a
        non-finite loss at the head. One small all-reduce per tick."""
        flags = torch.tensor([signal is not None, diverged is not None], dtype=torch.int32)
        notes: list = [None] * self.world_size

        def exchange() -> bool:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.tick_group)
            if bool(flags.any()):
                dist.all_gather_object(notes, (signal, diverged), group=self.tick_group)
            return bool(flags.any())

        if not self.collective(f"ending tick {tick}", exchange):
            return None, None
        signals = [f"{s} (rank {r})" for r, (s, _) in enumerate(notes) if s]
        return (", ".join(signals) or None), next((d for _, d in notes if d), None)

    # ---- failures -------------------------------------------------------------------------------
    def report(self, message: str) -> str:
        """Publish a failure to every rank (see :class:`FailureWatch`); returns the message to raise."""
        return self.watch.report(message)

    def close(self) -> None:
        """No more heartbeats, no more watching for the others' failures."""
        self.watch.close()


def _portable(err: BaseException) -> tuple:
    """``err`` as every rank can rebuild it: (type name, message, OSError arguments or None)."""
    if isinstance(err, OSError) and err.errno is not None:
        return type(err).__name__, str(err), (err.errno, err.strerror, err.filename)
    return type(err).__name__, str(err), None
