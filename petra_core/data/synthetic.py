"""A small generated image dataset that a tiny CNN learns in a few dozen steps.

Used for CPU-scale smoke runs and tests where no real data is at hand.  Each class has
a fixed random low-frequency colour template (a sum of a few 2-D cosines per channel,
periodic over the image); a sample is its class template circularly shifted by up to
``max_shift`` pixels plus Gaussian pixel noise, quantised to uint8.  Everything is drawn
from local generators keyed by ``seed`` (templates and each split have their own
stream), so the arrays are a pure function of the parameters.
"""
from __future__ import annotations

import numpy as np

from . import seeding
from .arrays import ArrayData, ArraySplit
from .errors import DataError

# Streams within the SYNTHETIC namespace.
_TEMPLATES, _TRAIN, _TEST = 0, 1, 2


def make_templates(num_classes: int, image_size: int, seed: int, components: int = 4) -> np.ndarray:
    """num_classes × 3 × S × S float templates in [0.15, 0.85]."""
    rng = seeding.numpy_rng(seed, seeding.SYNTHETIC, _TEMPLATES)
    s = image_size
    yy, xx = np.meshgrid(np.arange(s), np.arange(s), indexing="ij")
    out = np.empty((num_classes, 3, s, s))
    for k in range(num_classes):
        for c in range(3):
            t = np.zeros((s, s))
            for _ in range(components):
                fy, fx = rng.integers(0, 3, size=2)
                if fy == 0 and fx == 0:
                    fx = 1
                t += rng.normal() * np.cos(2 * np.pi * (fy * yy + fx * xx) / s + rng.uniform(0, 2 * np.pi))
            out[k, c] = 0.5 + 0.35 * t / max(np.abs(t).max(), 1e-8)
    return out.astype(np.float32)


def _sample(templates: np.ndarray, n: int, rng: np.random.Generator, max_shift: int, noise: float) -> ArraySplit:
    num_classes, _, s, _ = templates.shape
    labels = rng.permutation(np.arange(n) % num_classes).astype(np.int64)
    dy, dx = rng.integers(-max_shift, max_shift + 1, size=(2, n))
    rows = (np.arange(s)[None, :] - dy[:, None]) % s  # n × S
    cols = (np.arange(s)[None, :] - dx[:, None]) % s
    x = templates[labels[:, None, None, None], np.arange(3)[None, :, None, None],
                  rows[:, None, :, None], cols[:, None, None, :]]  # n × 3 × S × S, circular shift
    x += np.float32(noise) * rng.standard_normal(x.shape, dtype=np.float32)
    images = np.rint(np.clip(x, 0.0, 1.0) * 255).astype(np.uint8).transpose(0, 2, 3, 1)
    return ArraySplit(np.ascontiguousarray(images), labels)


def make_synthetic(num_classes: int = 10, n_train: int = 5000, n_test: int = 1000, image_size: int = 32,
                   seed: int = 0, max_shift: int = 2, noise: float = 0.15) -> ArrayData:
    """Generate the synthetic dataset; identical parameters give identical arrays."""
    if num_classes < 2 or n_train < 1 or n_test < 1 or image_size < 4 or max_shift < 0 or noise < 0:
        raise DataError(f"synthetic parameters num_classes={num_classes} n_train={n_train} n_test={n_test} "
                        f"image_size={image_size} max_shift={max_shift} noise={noise}; expected "
                        f"num_classes>=2, n_train/n_test>=1, image_size>=4, max_shift>=0, noise>=0")
    templates = make_templates(num_classes, image_size, seed)
    train = _sample(templates, n_train, seeding.numpy_rng(seed, seeding.SYNTHETIC, _TRAIN), max_shift, noise)
    test = _sample(templates, n_test, seeding.numpy_rng(seed, seeding.SYNTHETIC, _TEST), max_shift, noise)
    params = dict(num_classes=num_classes, n_train=n_train, n_test=n_test, image_size=image_size,
                  seed=seed, max_shift=max_shift, noise=noise)
    return ArrayData("synthetic", train, test, num_classes=num_classes,
                     class_names=tuple(f"class{k}" for k in range(num_classes)),
                     source={"kind": "synthetic", "params": params})
