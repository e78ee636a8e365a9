"""Failures seen by every rank: error types, one-line messages, the shared failure key, heartbeats.

The first rank to see a failure writes a message naming the failed stage(s) to the rendezvous
store (``petra/failed``, compare-and-set: the first report wins); a watchdog thread on every
rank ends its process with that message, whatever it is blocked in. The same thread bumps this
rank's heartbeat (``petra/alive/RANK``): when a collective breaks, the silent ranks are the dead.

A rank that leaves on its own (it reported a failure, stopped because of one, or finished) says
so first (``petra/left/RANK``: ``after a failure`` or ``finished``), so that a rank losing it
afterwards names it as stopped, not failed: a message names as failed only the rank that failed
first (a silent rank that said nothing: killed, crashed or hung), the others as stopped because of it.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Callable

import torch.distributed as dist

FAILURE_KEY = "petra/failed"
ALIVE_KEY = "petra/alive/{rank}"
LEFT_KEY = "petra/left/{rank}"
AFTER_FAILURE, FINISHED = "after a failure", "finished"  # why a rank left on its own (LEFT_KEY)
DEFAULT_TIMEOUT = 60.0
POLL = 0.5  # seconds between a watchdog's heartbeats and looks at the failure key


class PipelineError(RuntimeError):
    """A rank of a distributed pipeline failed or lost a peer. The message names the stage(s)."""


class ProtocolError(RuntimeError):
    """A message arrived that the schedule did not announce (a bug, or mismatched configurations)."""


def _bounded(fn: Callable[[], object], seconds: float) -> object:
    """Run ``fn`` in a daemon thread; None if it does not finish in time or raises."""
    box: list = [None]

    def target():
        with contextlib.suppress(Exception):
            box[0] = fn()

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(seconds)
    return box[0]


def _default_store():
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - no store (single process, custom init): no shared failure key
        return None


def short(err: BaseException) -> str:
    """First line of an error, without gloo's source location and advice."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|h|hpp):\d+\]\s*", "", text)
    text = text.split(". This is typically caused")[0]
    return text if len(text) < 300 else text[:297] + "..."


def gone(failed: list[str], stopped: list[str], timed_out: float | None) -> tuple[str, str]:
    """Who is gone when a collective breaks, and a tail for the others: the ranks that failed (silent,
    and said nothing: killed, crashed or hung) are named as failed; those that left on their own are
    listed as stopped because of it. ``timed_out``: the timeout, when the collective timed out."""
    if failed:
        tail = f"; {', '.join(stopped)} stopped because of it" if stopped else ""
        return f"{', '.join(failed)} failed or was killed", tail
    if stopped:
        return f"{', '.join(stopped)} stopped because of an earlier failure", ""
    if timed_out is not None:
        return f"another rank stopped responding: timed out after {timed_out:g} s", ""
    return "another rank failed or was killed", ""


def is_timeout(err: BaseException) -> bool:
    return isinstance(err, TimeoutError) or "timed out" in str(err).lower() or "timeout" in str(err).lower()


class FailureWatch:
    """Publishes this rank's first failure, watches for the other ranks', keeps this rank's heartbeat.
    ``describe()`` names this rank (``"rank 1 (stages 4-6)"``); ``tick()`` says where it is."""

    def __init__(self, rank: int, describe: Callable[[], str], tick: Callable[[], int], store=None):
        self.rank, self.describe, self.tick = rank, describe, tick
        self.store = store if store is not None else _default_store()
        self.failed: str | None = None
        self.stopped = threading.Event()  # no more watching for the others' failures
        self.closed = threading.Event()  # no more heartbeats either

    def start(self) -> None:
        """Start the watchdog thread (only useful with a store and more than one rank)."""
        if self.store is not None:
            threading.Thread(target=self._watch, daemon=True, name="petra-watchdog").start()

    def stop(self) -> None:
        self.stopped.set()

    def close(self) -> None:
        self.stopped.set()
        self.closed.set()
        self._leave(AFTER_FAILURE if self.failed is not None else FINISHED)

    def _leave(self, why: str) -> None:
        """Say that this rank leaves on its own, and why (the first reason stays)."""
        if self.store is not None:
            store, key = self.store, LEFT_KEY.format(rank=self.rank)
            _bounded(lambda: store.compare_set(key, "", why), 2.0)

    def left(self, rank: int) -> str | None:
        """Why ``rank`` left on its own (``AFTER_FAILURE``, ``FINISHED``), or None: it said nothing
        (killed, crashed or hung; or still running)."""
        if self.store is None:
            return None
        store, key = self.store, LEFT_KEY.format(rank=rank)
        found = _bounded(lambda: store.get(key).decode() if store.check([key]) else None, 2.0)
        return found or None

    def silent_ranks(self, world_size: int) -> list[int]:
        """The other ranks whose heartbeat does not move over a few beats (dead, or never started)."""
        if self.store is None:
            return []
        store = self.store

        def beats():
            return [_bounded(lambda r=r: store.add(ALIVE_KEY.format(rank=r), 0), 2.0) for r in range(world_size)]

        before = beats()
        time.sleep(4 * POLL)
        after = beats()
        return [r for r in range(world_size) if r != self.rank and (not after[r] or after[r] == before[r])]

    def report(self, message: str) -> str:
        """Publish ``message`` as this rank's failure (unless another rank's came first); returns the
        message to raise, led by the root cause when another rank reported one before."""
        self.failed = message
        self.stopped.set()
        first = None
        mine = f"{message} [seen by {self.describe()}]"
        if self.store is not None:
            store = self.store
            first = _bounded(lambda: store.compare_set(FAILURE_KEY, "", mine).decode(), 5.0)
        self._leave(AFTER_FAILURE)  # before this rank's connections close: who loses it knows why
        if first and first != mine:  # another rank saw a failure first: lead with it (the root cause)
            return f"{first}\n  then on {self.describe()}: {message}"
        return message

    def _watch(self) -> None:
        store, alive = self.store, ALIVE_KEY.format(rank=self.rank)
        while not self.closed.wait(POLL):
            try:
                store.add(alive, 1)
                if self.stopped.is_set() or not store.check([FAILURE_KEY]):
                    continue
                first = store.get(FAILURE_KEY).decode()
            except Exception:  # noqa: BLE001 - store gone (its host exited): rely on the connections
                return
            if self.stopped.is_set():
                continue
            self._leave(AFTER_FAILURE)
            print(
                f"{first}\n  {self.describe()} stopping at tick {self.tick()} because of it",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)
