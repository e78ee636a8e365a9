"""Activations: a tensor, or a RevNet's pair of streams (x, x̃) as two tensors.

A RevNet activation is two streams of the same shape. They travel as a tuple of two dense
tensors, not side by side in one tensor: a coupling (x, x̃) -> (x̃ + F(x), x) then passes x on
without a copy, F reads a dense x (a channel slice of one tensor is not dense, and every
convolution would copy it first), and autograd never splits or joins a gradient. The authors'
code keeps its streams apart for the same reason. Everything the engine does to an activation
(detach it, move it, count its bytes, send it) goes through the functions here, so a stage's
activation may be either kind.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

Activation = Tensor | tuple[Tensor, ...]


def is_pair(a) -> bool:
    return isinstance(a, tuple)


def apply(fn: Callable[[Tensor], Tensor], a: Activation | None) -> Activation | None:
    """``fn`` on every tensor of ``a`` (None stays None)."""
    if a is None:
        return None
    # on the hot path of every tick: isinstance inline, a list (no generator resumed per tensor)
    return tuple([fn(t) for t in a]) if isinstance(a, tuple) else fn(a)


def tensors(a: Activation | None) -> tuple[Tensor, ...]:
    """The tensors of ``a``, in order (none for None)."""
    if a is None:
        return ()
    return tuple(a) if isinstance(a, tuple) else (a,)


def nbytes(a: Activation | None) -> int:
    """Logical bytes of ``a`` (its elements, not its storage's)."""
    return sum([t.numel() * t.element_size() for t in tensors(a)])


def shape(a: Activation) -> tuple[int, ...]:
    """The shape of ``a`` as one tensor: a pair's streams side by side along channels."""
    if not is_pair(a):
        return tuple(a.shape)
    first = tuple(a[0].shape)
    return (first[0], sum(t.shape[1] for t in a), *first[2:])


def join(a: Activation) -> Tensor:
    """``a`` as one tensor, the streams side by side along channels (a copy for a pair): for what
    reads the whole activation at once, such as an auxiliary head or a comparison."""
    return torch.cat(a, dim=1) if is_pair(a) else a


def dense(t: Tensor) -> Tensor:
    """``t``, or a dense copy of it in the same memory format (a channel slice is not dense)."""
    if t.is_contiguous() or (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)):
        return t
    if t.dim() == 4 and t.stride(1) == 1:  # a channel slice of a channels-last tensor
        return t.contiguous(memory_format=torch.channels_last)
    return t.contiguous()


def streams_of(t: Tensor) -> tuple[Tensor, Tensor]:
    """One tensor's two channel halves as dense streams (a RevNet stem's output)."""
    a, b = t.chunk(2, dim=1)
    return dense(a), dense(b)


class _GradInOwnLayout(torch.autograd.Function):
    """The identity, whose backward hands the gradient on laid out as the tensor itself is."""

    @staticmethod
    def forward(ctx, t: Tensor) -> Tensor:
        ctx.layout = (t.shape, t.stride())
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        shape, stride = ctx.layout
        return (
            g if g.stride() == stride else torch.empty_strided(shape, stride, dtype=g.dtype, device=g.device).copy_(g)
        )


def attached(a: Activation) -> Activation:
    """``a`` with its graph, for a next stage that joins it (``engine/assembly.py: joined_stages``).
    Its gradient comes back laid out as ``a`` is, as a separate stage's input leaf would receive
    it (autograd's layout contract for a leaf's ``.grad``): a channels-last activation gets a
    channels-last gradient, so the earlier stage's kernels, and its bits, are those of separate
    graphs."""
    return apply(_GradInOwnLayout.apply, a)


def leaves(a: Activation, requires_grad: bool) -> Activation:
    """``a`` detached into fresh autograd leaves (a local graph's inputs); integer tensors never
    require a gradient."""
    return apply(lambda t: t.detach().requires_grad_(requires_grad and t.is_floating_point()), a)


def device(a: Activation) -> torch.device:
    return tensors(a)[0].device


def grads(leaves: Activation) -> Activation | None:
    """The ``.grad`` of every leaf of ``leaves``, in its kind; None if any is missing."""
    gs = [leaf.grad for leaf in tensors(leaves)]
    if any(g is None for g in gs):
        return None
    return tuple(gs) if is_pair(leaves) else gs[0]
