"""Numeric precision of a run's compute, and cuDNN's algorithm choice, as two separate settings.

``precision`` (the run config's key of that name):

* ``fp32``: strict float32 everywhere (TF32 off for matmuls and convolutions, so a GPU run
  computes what a CPU run computes, up to kernel order);
* ``tf32``: TF32 matmuls and convolutions on CUDA (the same as fp32 on a CPU);
* ``bf16``: ``torch.autocast`` to bfloat16 around every stage's forward and rebuild
  (convolutions and matmuls in bf16; batch norm, the loss and the reversible couplings'
  additions stay float32, as autocast's op lists say). Weights, gradients, optimizer state and
  the activations stages send each other stay float32. A reversible stage rebuilds its input
  under the same autocast as its forward, so F and G round the same way both times: from its
  exact output the rebuilt input is within ~1e-11 of the true one; from an input that was itself
  rebuilt (a chain of reversible stages) each stage adds about bf16's rounding, 1e-3 to 1e-2
  relative (``petra_core.accounting.reconstruction``, measured in docs/reproducing.md).

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
    return {"tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32,
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "cudnn_deterministic": torch.backends.cudnn.deterministic, "cudnn_benchmark": torch.backends.cudnn.benchmark}


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
