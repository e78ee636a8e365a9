"""The run's ranks kept in step (:class:`Ranks`): the clock (tick boundaries), the run's own
collectives (gathers, ``share``, ``together``, the per-tick ``agree``) and what a failure
becomes. :class:`LocalRanks` is a world of one process, where each of them is trivial.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Ranks(Protocol):
    def begin_tick(self, tick: int) -> None: ...
    def end_tick(self, tick: int) -> None: ...
    def gather_object(self, obj, dst: int = 0) -> list | None: ...
    def share(self, obj): ...
    def all_objects(self, obj) -> list: ...
    def together(self, fn: Callable, errors=()): ...
    def on_main(self, fn: Callable, errors=()): ...
    def all_true(self, flag: bool) -> bool: ...
    def agree(self, signal: str | None, diverged: str | None, tick: int) -> tuple[str | None, str | None]: ...
    def report(self, message: str) -> str: ...
    def close(self) -> None: ...


class LocalRanks:
    """One process: every collective is of one, no other rank needs telling of a failure."""

    def begin_tick(self, tick: int) -> None:
        pass

    def end_tick(self, tick: int) -> None:
        pass

    def gather_object(self, obj, dst: int = 0) -> list:
        return [obj]

    def share(self, obj):
        return obj

    def all_objects(self, obj) -> list:
        return [obj]

    def together(self, fn: Callable, errors=()):
        return fn()

    def on_main(self, fn: Callable, errors=()):
        return fn()

    def all_true(self, flag: bool) -> bool:
        return flag

    def agree(self, signal: str | None, diverged: str | None, tick: int) -> tuple[str | None, str | None]:
        return signal, diverged

    def report(self, message: str) -> str:
        return message

    def close(self) -> None:
        pass
