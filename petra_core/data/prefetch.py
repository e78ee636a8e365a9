"""Minibatches made ahead of time by a background thread, pinned for a fast copy to the GPU.

A training stream's batch is a pure function of its index (``stream.py``), so the batches the
pipeline will ask for next can be decoded, augmented and normalised while the GPU computes: the
pipeline only waits for a batch that is not ready yet, and copies it from pinned memory without
stopping the host. The batches are the same, so a run is the same with or without prefetching.
"""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from torch import Tensor

Batch = tuple[Tensor, Tensor]


class Prefetcher:
    """``get_batch(mb)`` with minibatches ``mb + stride … mb + ahead·stride`` made in a background
    thread (``stride``: R for one replica of R, which reads every R-th minibatch of the stream).

    ``limit``: the number of minibatches there are (nothing is made past it). ``pin``: put every
    batch in pinned (page-locked) memory, so ``.to(cuda, non_blocking=True)`` is truly asynchronous.
    """

    def __init__(self, get_batch: Callable[[int], Batch], *, ahead: int = 4, pin: bool = False,
                 limit: int | None = None, stride: int = 1):
        self.get_batch, self.ahead, self.pin, self.limit, self.stride = get_batch, ahead, pin, limit, stride
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="petra-prefetch")
        self.pending: dict[int, Future] = {}

    def _make(self, mb: int) -> Batch:
        batch = self.get_batch(mb)
        return tuple(t.pin_memory() for t in batch) if self.pin else batch

    def __call__(self, mb: int) -> Batch:
        future = self.pending.pop(mb, None) or self.pool.submit(self._make, mb)
        for old in [m for m in self.pending if m < mb]:  # asked out of order (a resume): drop
            self.pending.pop(old).cancel()
        end = mb + 1 + self.ahead * self.stride
        end = end if self.limit is None else min(end, self.limit)
        for ahead in range(mb + self.stride, end, self.stride):
            if ahead not in self.pending:
                self.pending[ahead] = self.pool.submit(self._make, ahead)
        return future.result()

    def close(self) -> None:
        for future in self.pending.values():
            future.cancel()
        self.pool.shutdown(wait=True)
