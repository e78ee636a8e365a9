"""In-memory (or memory-mapped) form shared by every small-image source.

Each 32×32 source (CIFAR-10 in any of its forms, ImageNet32, synthetic) is turned into
the same layout — ``images`` N×H×W×3 uint8 and ``labels`` int64 N for a train and a
test split — so preparation, augmentation and streaming are written once.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import seeding
from .errors import DataError


@dataclass(frozen=True)
class ArraySplit:
    """One split: ``images`` N×H×W×3 uint8 (HWC, RGB) and ``labels`` int64 N."""

    images: np.ndarray
    labels: np.ndarray

    def __post_init__(self) -> None:
        check_split(self.images, self.labels, "split")

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def image_size(self) -> int:
        return int(self.images.shape[1])


@dataclass(frozen=True)
class ArrayData:
    """A train and a test split plus what is known about the classes and the origin."""

    name: str
    train: ArraySplit
    test: ArraySplit
    num_classes: int
    class_names: tuple[str, ...] | None = None
    source: dict = field(default_factory=dict)  # JSON-able description of the origin
    manifest: dict | None = None  # set when loaded from a prepared directory

    def __post_init__(self) -> None:
        if self.train.images.shape[1:] != self.test.images.shape[1:]:
            raise DataError(f"{self.name}: train images {self.train.images.shape[1:]} and test images "
                            f"{self.test.images.shape[1:]} differ in shape; expected the same H×W×3")
        if self.class_names is not None and len(self.class_names) != self.num_classes:
            raise DataError(f"{self.name}: {len(self.class_names)} class names for {self.num_classes} classes")
        for split_name, split in (("train", self.train), ("test", self.test)):
            if len(split) and (split.labels.min() < 0 or split.labels.max() >= self.num_classes):
                raise DataError(f"{self.name}: {split_name} labels span {split.labels.min()}..{split.labels.max()}; "
                                f"expected 0..{self.num_classes - 1}")

    @property
    def image_size(self) -> int:
        return self.train.image_size


def check_split(images: np.ndarray, labels: np.ndarray, what: str) -> None:
    """Raise DataError unless ``images``/``labels`` have the canonical layout."""
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 4 or images.shape[3] != 3:
        raise DataError(f"{what}: images {getattr(images, 'dtype', type(images))} "
                        f"{getattr(images, 'shape', '')}; expected uint8 N×H×W×3")
    if images.shape[1] != images.shape[2]:
        raise DataError(f"{what}: images are {images.shape[1]}×{images.shape[2]}; expected square images")
    if not isinstance(labels, np.ndarray) or labels.dtype != np.int64 or labels.shape != images.shape[:1]:
        raise DataError(f"{what}: labels {getattr(labels, 'dtype', type(labels))} "
                        f"{getattr(labels, 'shape', '')}; expected int64 of shape ({images.shape[0]},)")


def subset_indices(n_total: int, n: int, seed: int = 0) -> np.ndarray:
    """The first ``n`` of a fixed seeded permutation of ``range(n_total)``, sorted.

    The subset depends on ``seed`` (default 0), not on the training seed, so runs with
    different training seeds see the same examples.
    """
    if not 0 < n <= n_total:
        raise DataError(f"subset={n}: expected 1..{n_total} (the training set size)")
    perm = seeding.numpy_rng(seed, seeding.SUBSET, n_total).permutation(n_total)
    return np.sort(perm[:n])


def take_subset(split: ArraySplit, n: int, seed: int = 0) -> ArraySplit:
    """An in-memory copy of ``n`` examples of ``split`` chosen by :func:`subset_indices`."""
    idx = subset_indices(len(split), n, seed)
    return ArraySplit(np.ascontiguousarray(split.images[idx]), np.ascontiguousarray(split.labels[idx]))
