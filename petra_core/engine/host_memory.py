"""Keep freed host memory in the process, so a training step does not fault it back in.

Every tick allocates and frees the same activation-sized CPU buffers. With glibc's defaults a
buffer above the (dynamic) mmap threshold is mapped and unmapped each time, and a freed top of the
heap is trimmed back to the kernel; the next allocation of that size faults every page in again.
On a 2-core machine, RevNet18 at width 8, batch 64, that is about 10,000 page faults and a tenth
of the step's time in the kernel, more when a pipeline's stages free their buffers at different
ticks than one autograd graph would (``benchmarks/bench_speed.py`` prints the faults per step).

:func:`retain_freed_memory` sets three ``mallopt`` parameters: every buffer of the main thread
comes from the heap (no ``mmap`` of its own, however large: at width 64 a stage's activation
passes the 32 MiB that is glibc's largest mmap threshold, and delayed gradients then faulted
5,000 pages a minibatch back in), and the heap is trimmed only when 1 GiB is free at its top. The
process keeps what it has freed for reuse; its peak resident memory is what the run needs at its
peak either way. It changes where buffers live, never what is computed: the bits of a run are
the same with and without it (``tests/test_host_memory.py``).

It is process-wide, so the engine never applies it: building a pipeline changes no process state.
Whoever owns the process calls it once, before its pipeline: the trainer (``run/trainer.py``, which
records what it set in the run's ``env.json`` as ``host_malloc``), each rank of the distributed
tests' rank program and the benchmarks that measure speed. ``PETRA_HOST_MALLOC=system`` leaves
glibc's defaults; on a C library without ``mallopt`` (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # glibc's malloc.h
MMAP_THRESHOLD = 32 * 2**20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: the largest it accepts
TRIM_THRESHOLD = 2**30
ENV = "PETRA_HOST_MALLOC"
CHOICES = ("retain", "system")

_applied: bool | None = None


def setting() -> str:
    """The host allocator setting asked for by ``PETRA_HOST_MALLOC`` (default ``retain``)."""
    value = os.environ.get(ENV, "retain")
    if value not in CHOICES:
        raise ValueError(f"{ENV}={value!r}: allowed values are {', '.join(CHOICES)}")
    return value


def retain_freed_memory() -> bool:
    """Apply the setting once per process; True when glibc now keeps freed memory."""
    global _applied
    if _applied is None:
        _applied = (
            setting() == "retain"
            and _mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
            and _mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
            and _mallopt(M_MMAP_MAX, 0)
        )
    return _applied


def _mallopt(param: int, value: int) -> bool:
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        fn = None
    return bool(fn is not None and fn(param, value) == 1)


def page_faults() -> int:
    """Minor page faults of this process so far (what :func:`retain_freed_memory` saves)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
