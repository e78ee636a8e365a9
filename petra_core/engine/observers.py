"""Observers of the runner: what accounting (or a user) hooks into without changing the engine.

A :class:`~petra_core.engine.pipeline.Pipeline` calls every observer in ``pipeline.observers``
around each phase of each stage copy: ``before(phase, worker, mb)`` and ``after(phase, worker,
mb)``, where ``phase`` is one of :data:`PHASES` (``send``: handing a message to the world);
``sent(worker, direction, msg)`` after each message it hands to the world, and
``fetched(replica, mb, batch)`` when stage 0 of a replica gets
minibatch ``mb`` (the global minibatch id). ``mb`` is the worker's own (per-replica) minibatch,
None for a step. Observers read; they never change a value, an order or a decision of the run.
"""

from __future__ import annotations

from collections.abc import Sequence

PHASES = ("forward", "rebuild", "backward", "send", "step")


class Observer:
    """No-op base: override what you need."""

    def before(self, phase: str, worker, mb: int | None) -> None:
        pass

    def after(self, phase: str, worker, mb: int | None) -> None:
        pass

    def sent(self, worker, direction: str, msg) -> None:
        pass

    def fetched(self, replica: int, mb: int, batch) -> None:
        pass


def observed(observers: Sequence[Observer], phase: str, worker, mb: int | None, fn, *args):
    """``fn(*args)`` between every observer's ``before`` and ``after`` of ``phase``."""
    for o in observers:
        o.before(phase, worker, mb)
    out = fn(*args)
    for o in observers:
        o.after(phase, worker, mb)
    return out
