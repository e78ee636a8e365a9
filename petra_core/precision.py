"""Numeric precision of a run's compute, and cuDNN's algorithm choice, as two separate settings.

``precision`` (the run config's key of that name):

* ``fp32``: strict float32 everywhere (TF32 off for matmuls and convolutions, so a GPU run
  computes what a CPU run computes, up to kernel order);
* ``tf32``: TF32 matmuls and convolutions on CUDA (the same as fp32 on a CPU);
* ``bf16``: ``torch.autocast`` to bfloat16 around every stage's forward and rebuild
  (convolutions and matmuls in bf16; batch norm, the loss and the reversible couplings'
  additions stay float32, as autocast's op lists say). Weights, gradients, optimizer state and
  the activations stages send each other stay float32. That float32 stream is what keeps PETRA
  exact: a reversible coupling adds a bf16 F(x) (8 significant bits) to a float32 stream, which
  float32 represents exactly in nearly every element, and its inverse subtracts the same bf16
  F(x), recomputed on the same input. Rebuilt inputs come back within ~1e-10 (relative), closer
  than at fp32 (~1e-7); with bf16 activations between stages they would drift by 1e-3 to 1e-2
  (``petra_core.accounting.reconstruction``, ``benchmarks/bench_precision.py``).

``deterministic`` (also a run key, independent of precision): deterministic algorithms, cuDNN
in deterministic mode without benchmarking; off, cuDNN benchmarks its algorithms (fastest).
"""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("fp32", "tf32", "bf16")


def check_precision(name: str) -> str:
    if name not in PRECISIONS:
        raise ValueError(f"precision {name!r} is not allowed; allowed: {', '.join(PRECISIONS)}")
    return name


def set_numerics(precision: str, deterministic: bool) -> dict:
    """Set the process-wide flags of ``precision`` and ``deterministic``; returns :func:`numerics`."""
    check_precision(precision)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic
    return numerics()


def numerics() -> dict:
    """The flags in force, as a run records them (env.json)."""
    return {
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }


def compute(precision: str, device: torch.device):
    """The context a stage's forward and rebuild run in: autocast for ``bf16``, nothing otherwise."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def precision_scope(name: str, device: torch.device):
    """``name``'s TF32 flags and autocast for code run on ``device``, restoring the flags after
    (for measurements that try several precisions in one process)."""
    check_precision(name)
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = name == "tf32"
    try:
        with compute(name, device):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


def widen(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 if autocast left it in a 16-bit type; float32 and float64 pass unchanged
    (the float64 oracles stay float64)."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t
