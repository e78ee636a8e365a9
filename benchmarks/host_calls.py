"""Host Python calls per call of a function, counted with ``sys.setprofile``.

A time measured on a shared CPU moves with its neighbours' load; the number of Python function
calls the host makes for one pipeline tick does not. On a GPU that waits for the host, those calls
are most of a tick's time, so this count steers the host-side work without a GPU (issue 41):
``python_calls`` counts the profiler's ``call`` events (Python functions, including ``fn``
itself, and each resumption of a generator), ``c_calls`` its ``c_call`` events (built-in and
extension functions called from Python, such as torch's operators). Only the calling thread is
counted.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterable


def count_calls(fn: Callable[[], object], repeat: int = 1, skip: Iterable[Callable] = ()) -> dict[str, float]:
    """``{"python_calls", "c_calls"}`` per call of ``fn()``, averaged over ``repeat`` calls.
    ``skip``: functions counted as one call each, without what they call (what one CUDA graph
    replay stands for: a static phase's compute, engine/phases.py)."""
    if not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be an integer >= 1, got {repeat!r}")
    counts = {"call": 0, "c_call": 0}
    restore = sys.setprofile
    skipped = {f.__code__ for f in skip}
    inside = [0]  # depth in skipped functions

    def profiler(frame, event, arg):
        if frame.f_code in skipped and event in ("call", "return"):
            inside[0] += 1 if event == "call" else -1
            if event == "call" and inside[0] == 1:
                counts["call"] += 1
            return
        if event in counts and arg is not restore and not inside[0]:  # not the call that ends the count
            counts[event] += 1

    calls = itertools.repeat(fn, repeat)  # made before counting: its iteration is no call event
    previous = sys.getprofile()
    sys.setprofile(profiler)
    try:
        for call in calls:
            call()
    finally:
        restore(previous)
    return {"python_calls": counts["call"] / repeat, "c_calls": counts["c_call"] / repeat}
