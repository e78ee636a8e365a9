"""Derive independent RNG seeds from tuples such as (seed, epoch, batch index).

Resumable training needs every random draw to be a pure function of where it happens
(which epoch, which batch), never of how many draws came before.  ``numpy``'s
``SeedSequence`` hashes a tuple of integers into well-mixed, independent states, so
(seed, epoch) and (seed, epoch, index) streams never overlap.  A small integer *tag*
keeps streams of different purposes (permutation, augmentation, subset) apart.
"""
from __future__ import annotations

import numpy as np
import torch

# Purposes of random streams; part of the seed tuple so they never collide.
PERMUTATION = 1
AUGMENTATION = 2
SUBSET = 3
SYNTHETIC = 4
TEXT_WINDOWS = 5  # the window starts of a text training batch (text_stream.py)


def derive_seed(*key: int) -> int:
    """A 63-bit seed (valid for ``torch.Generator.manual_seed``) determined by ``key``."""
    if any(int(k) < 0 for k in key):
        raise ValueError(f"seed key {key} must contain non-negative integers")
    state = np.random.SeedSequence([int(k) for k in key]).generate_state(2, dtype=np.uint32)
    return ((int(state[0]) << 32) | int(state[1])) & ((1 << 63) - 1)


def numpy_rng(*key: int) -> np.random.Generator:
    """A local numpy generator for ``key`` (never touches the global RNG)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(k) for k in key])))


def torch_rng(*key: int) -> torch.Generator:
    """A local CPU torch generator for ``key`` (never touches the global RNG)."""
    g = torch.Generator(device="cpu")
    g.manual_seed(derive_seed(*key))
    return g
