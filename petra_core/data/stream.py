"""Deterministic, resumable minibatch streams.

A batch is a pure function of (seed, epoch, index): the epoch's example order is a
permutation drawn from a generator keyed by (seed, epoch), and the augmentation of
batch ``index`` from a generator keyed by (seed, epoch, index).  Resuming after an
interruption is therefore just ``iter_epoch(epoch, start=next_index)`` — no RNG state
to checkpoint, and the resumed run sees exactly the batches the uninterrupted one would.

Training streams shuffle, augment and (by default) drop the last partial batch;
evaluation streams (``train=False``) keep the stored order, never augment and always
keep the last partial batch, so every example is seen exactly once.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from . import seeding
from .arrays import ArraySplit
from .augment import IMAGENET_NORM, Normalization, crop_flip, to_model_input
from .errors import DataError
from .imagenet import CROP, RESIZE, eval_transform, train_transform

Batch = tuple[torch.Tensor, torch.Tensor]


class _Stream:
    """Order and batch bookkeeping shared by the array and folder streams."""

    def __init__(self, num_examples: int, batch_size: int, *, seed: int, train: bool, drop_last: bool) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise DataError(f"batch_size={batch_size!r}; expected a positive integer")
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise DataError(f"seed={seed!r}; expected a non-negative integer")
        self.num_examples, self.batch_size, self.seed, self.train = num_examples, batch_size, int(seed), train
        self.drop_last = bool(drop_last and train)  # evaluation always keeps the last partial batch
        if self.num_batches == 0:
            raise DataError(f"batch_size={batch_size} with {num_examples} examples and drop_last: no full batch; "
                            f"expected batch_size <= {num_examples}")
        self._cached_order: tuple[int, np.ndarray] | None = None

    @property
    def num_batches(self) -> int:
        """Batches per epoch."""
        if self.drop_last:
            return self.num_examples // self.batch_size
        return -(-self.num_examples // self.batch_size)

    def __len__(self) -> int:
        return self.num_batches

    def order(self, epoch: int) -> np.ndarray:
        """Example order of ``epoch``: a permutation keyed by (seed, epoch), or 0…N-1 for evaluation."""
        if epoch < 0:
            raise DataError(f"epoch={epoch}; expected a non-negative integer")
        if not self.train:
            return np.arange(self.num_examples)
        if self._cached_order is None or self._cached_order[0] != epoch:
            perm = seeding.numpy_rng(self.seed, seeding.PERMUTATION, epoch).permutation(self.num_examples)
            self._cached_order = (epoch, perm)
        return self._cached_order[1]

    def batch_indices(self, epoch: int, index: int) -> np.ndarray:
        """Example indices of batch ``index`` of ``epoch``."""
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch index {index} out of range 0..{self.num_batches - 1}")
        return self.order(epoch)[index * self.batch_size:(index + 1) * self.batch_size]

    def augmentation_generator(self, epoch: int, index: int) -> torch.Generator:
        return seeding.torch_rng(self.seed, seeding.AUGMENTATION, epoch, index)

    def batch(self, epoch: int, index: int) -> Batch:
        raise NotImplementedError

    def iter_epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """Batches ``start`` … ``num_batches - 1`` of ``epoch`` (resume mid-epoch with ``start``)."""
        if not 0 <= start <= self.num_batches:
            raise IndexError(f"start={start} out of range 0..{self.num_batches}")
        for index in range(start, self.num_batches):
            yield self.batch(epoch, index)


class MinibatchStream(_Stream):
    """Minibatches of an in-memory (or memory-mapped) :class:`ArraySplit` of 32×32 images.

    ``batch(epoch, index)`` returns float32 N×3×H×W images normalised with ``norm``
    (scaled to [0, 1] only if ``norm`` is None) and int64 labels.  Training batches get
    a random crop with ``pad`` pixels of zero padding and a horizontal flip.
    """

    def __init__(self, dataset: ArraySplit, batch_size: int, *, seed: int, train: bool, drop_last: bool = True,
                 norm: Normalization | None = None, pad: int = 4, flip: bool = True) -> None:
        super().__init__(len(dataset), batch_size, seed=seed, train=train, drop_last=drop_last)
        self.dataset, self.norm, self.pad, self.flip = dataset, norm, pad, flip

    def raw_batch(self, epoch: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The (augmented, for training) uint8 N×H×W×3 images and labels, before normalisation."""
        idx = self.batch_indices(epoch, index)
        images = torch.from_numpy(np.ascontiguousarray(self.dataset.images[idx]))
        labels = torch.from_numpy(np.asarray(self.dataset.labels[idx], dtype=np.int64))
        if self.train:
            images = crop_flip(images, self.augmentation_generator(epoch, index), pad=self.pad, flip=self.flip)
        return images, labels

    def batch(self, epoch: int, index: int) -> Batch:
        images, labels = self.raw_batch(epoch, index)
        return to_model_input(images, self.norm), labels


class _EpochBatches(Dataset):
    """Batch ``i`` of one epoch as a map-style dataset item, for DataLoader workers."""

    def __init__(self, stream: "FolderMinibatchStream", epoch: int) -> None:
        self.stream, self.epoch = stream, epoch

    def __len__(self) -> int:
        return self.stream.num_batches

    def __getitem__(self, index: int) -> Batch:
        return self.stream.batch(self.epoch, index)


class FolderMinibatchStream(_Stream):
    """Minibatches of an ``ImageFolder`` (full-size ImageNet), decoded and augmented per sample.

    Sample ``k`` of a training batch is augmented with parameters drawn, in sample order,
    from the batch's (seed, epoch, index) generator, so batches are reproducible no matter
    which worker builds them.  ``iter_epoch`` builds batches in ``num_workers`` processes.
    ``indices`` restricts the stream to those dataset indices (a subset).
    """

    def __init__(self, dataset, batch_size: int, *, seed: int, train: bool, drop_last: bool = True,
                 norm: Normalization | None = IMAGENET_NORM, size: int = CROP, resize: int = RESIZE,
                 num_workers: int = 0, indices: np.ndarray | None = None) -> None:
        self.indices = None if indices is None else np.asarray(indices, dtype=np.int64)
        n = len(dataset) if self.indices is None else len(self.indices)
        super().__init__(n, batch_size, seed=seed, train=train, drop_last=drop_last)
        self.dataset, self.norm, self.size, self.resize, self.num_workers = dataset, norm, size, resize, num_workers

    def raw_batch(self, epoch: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 N×3×size×size images (augmented for training) and int64 labels."""
        idx = self.batch_indices(epoch, index)
        if self.indices is not None:
            idx = self.indices[idx]
        g = self.augmentation_generator(epoch, index) if self.train else None
        images, labels = [], []
        for i in idx.tolist():
            path, label = self.dataset.samples[i]
            try:
                image = self.dataset.loader(path)
            except OSError as e:
                raise DataError(f"{path}: cannot decode image ({e}); expected a readable image file") from None
            images.append(train_transform(image, g, self.size) if self.train
                          else eval_transform(image, self.size, self.resize))
            labels.append(label)
        return torch.stack(images), torch.tensor(labels, dtype=torch.int64)

    def batch(self, epoch: int, index: int) -> Batch:
        images, labels = self.raw_batch(epoch, index)
        x = images.to(torch.float32).div_(255.0) if self.norm is None else self.norm(images)
        return x.contiguous(), labels

    def iter_epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        if not 0 <= start <= self.num_batches:
            raise IndexError(f"start={start} out of range 0..{self.num_batches}")
        if self.num_workers == 0:
            yield from super().iter_epoch(epoch, start)
            return
        self.order(epoch)  # compute once here; forked workers inherit the cache
        loader = DataLoader(_EpochBatches(self, epoch), batch_size=None, sampler=range(start, self.num_batches),
                            num_workers=self.num_workers, pin_memory=torch.cuda.is_available(),
                            prefetch_factor=2)
        yield from loader
