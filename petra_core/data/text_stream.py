"""Deterministic, resumable minibatches of a character corpus: windows of ``context + 1`` characters.

A minibatch is ``batch_size`` windows; its inputs are each window's first ``context`` characters and
its targets the next ``context`` (every position's next character), both int64 (B, T).

* Training draws the window starts uniformly over the split, with replacement (nanoGPT's
  sampling), from a generator keyed by (seed, epoch, index): a batch is a pure function of where it
  is, so a resumed run sees exactly the batches of an uninterrupted one, as with
  :class:`~petra_core.data.stream.MinibatchStream`. An epoch is ``(tokens - 1) // context``
  windows by default, i.e. about one pass's worth of the split's characters as targets, so
  ``epochs`` means what it does for images (a sweep of the data's size); ``windows`` sets another
  number (an epoch is when a run evaluates and checkpoints: a short one for a test, or for a
  finer validation curve). Minibatches per epoch: ``windows // batch_size`` (the last partial
  batch dropped).
* Evaluation reads the split once, in order, as non-overlapping consecutive windows (starts 0, T,
  2T, ...), every full window exactly once, the last partial batch kept.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from . import seeding
from .errors import DataError

Batch = tuple[torch.Tensor, torch.Tensor]


class TextStream:
    """Minibatches of windows of a 1-D token array (see the module docstring); the interface of
    :class:`~petra_core.data.stream.MinibatchStream`: ``num_batches``, ``batch(epoch, index)``,
    ``iter_epoch(epoch, start)``."""

    def __init__(
        self, tokens: np.ndarray, batch_size: int, context: int, *, seed: int, train: bool, windows: int | None = None
    ) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise DataError(f"batch_size={batch_size!r}; expected a positive integer")
        if not isinstance(context, int) or isinstance(context, bool) or context < 1:
            raise DataError(f"context={context!r}; expected a positive integer (characters per window)")
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise DataError(f"seed={seed!r}; expected a non-negative integer")
        if tokens.ndim != 1 or len(tokens) < context + 1:
            raise DataError(
                f"context={context} needs windows of {context + 1} characters; the split has "
                f"{len(tokens)}; expected context <= {len(tokens) - 1}"
            )
        self.tokens, self.batch_size, self.context = tokens, batch_size, context
        self.seed, self.train = int(seed), train
        self.num_windows = (len(tokens) - 1) // context
        if windows is not None:
            if not train or not isinstance(windows, int) or isinstance(windows, bool) or windows < 1:
                raise DataError(f"windows={windows!r} for a{' training' if train else 'n evaluation'} stream; "
                                f"expected a positive integer, for training only (evaluation reads every window)")
            self.num_windows = windows
        if self.num_batches == 0:
            raise DataError(
                f"batch_size={batch_size} with {self.num_windows} windows of {context} characters per "
                f"epoch: no full batch; expected batch_size <= {self.num_windows}"
            )
        self._offsets = np.arange(context + 1)

    @property
    def num_batches(self) -> int:
        """Batches per epoch (training: full batches only; evaluation: every window once)."""
        if self.train:
            return self.num_windows // self.batch_size
        return -(-self.num_windows // self.batch_size)

    def __len__(self) -> int:
        return self.num_batches

    def starts(self, epoch: int, index: int) -> np.ndarray:
        """The window starts of batch ``index`` of ``epoch``."""
        if epoch < 0:
            raise DataError(f"epoch={epoch}; expected a non-negative integer")
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch index {index} out of range 0..{self.num_batches - 1}")
        if not self.train:
            first = index * self.batch_size
            return np.arange(first, min(first + self.batch_size, self.num_windows)) * self.context
        rng = seeding.numpy_rng(self.seed, seeding.TEXT_WINDOWS, epoch, index)
        return rng.integers(0, len(self.tokens) - self.context, size=self.batch_size)

    def batch(self, epoch: int, index: int) -> Batch:
        windows = np.asarray(self.tokens[self.starts(epoch, index)[:, None] + self._offsets], dtype=np.int64)
        windows = torch.from_numpy(windows)
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

    def iter_epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """Batches ``start`` … ``num_batches - 1`` of ``epoch`` (resume mid-epoch with ``start``)."""
        if not 0 <= start <= self.num_batches:
            raise IndexError(f"start={start} out of range 0..{self.num_batches}")
        for index in range(start, self.num_batches):
            yield self.batch(epoch, index)
