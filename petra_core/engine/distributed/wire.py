"""Wire format of a message between two ranks: a fixed-size int64 header, then its tensors.

Header: magic, direction, minibatch, the kind of each of the message's two fields (0: none, 1: a
tensor, 2: a pair of streams), then ``SLOTS`` tensor slots (presence, dtype, layout, ndim and up
to ``MAX_DIMS`` dimensions), filled by the fields' tensors in order. Forward fields are
(activation, labels); backward fields are (grad, activation). Each present tensor follows as one
send. Channels-last activations travel as a dense NHWC view and get their layout back on arrival.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ...models import streams
from ..messages import BackwardMsg, ForwardMsg

DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
)
MAGIC = 0x5E7A
MAX_DIMS = 6
SLOT = 4 + MAX_DIMS  # present, dtype, layout, ndim, dims
SLOTS = 4  # two fields, each at most a pair
HEADER = 5 + SLOTS * SLOT  # magic, direction, minibatch, two field kinds, the slots
FORWARD, BACKWARD = 0, 1
DIRECTION = {FORWARD: "forward", BACKWARD: "backward"}


def to_wire(t: Tensor | None) -> tuple[list[int], Tensor | None]:
    """Header slot and the dense tensor to send (channels-last activations travel as NHWC)."""
    if t is None:
        return [0] * SLOT, None
    if t.dtype not in DTYPES:
        raise TypeError(f"cannot send a tensor of dtype {t.dtype}")
    layout = 0
    if not t.is_contiguous():
        if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
            t, layout = t.permute(0, 2, 3, 1), 1  # a dense NHWC view: no copy
        else:
            t = t.contiguous()
    if t.dim() > MAX_DIMS:
        raise ValueError(f"cannot send a tensor with {t.dim()} dimensions (at most {MAX_DIMS})")
    shape = list(t.shape)
    return [1, DTYPES.index(t.dtype), layout, len(shape), *shape, *[0] * (MAX_DIMS - len(shape))], t


def from_wire(slot: Sequence[int], device: torch.device) -> tuple[Tensor, int] | None:
    """An empty tensor shaped like a header slot describes, and its layout flag."""
    if not slot[0]:
        return None
    ndim = slot[3]
    return torch.empty(list(slot[4 : 4 + ndim]), dtype=DTYPES[slot[1]], device=device), slot[2]


def restore_layout(t: Tensor, layout: int) -> Tensor:
    return t.permute(0, 3, 1, 2) if layout == 1 else t


def field_kind(field) -> int:
    """0: no field, 1: a tensor, 2: a pair of streams."""
    return len(streams.tensors(field))


def flatten(fields) -> tuple[list[int], list[Tensor]]:
    """The kinds of a message's fields and their tensors in wire order."""
    return [field_kind(f) for f in fields], [t for f in fields for t in streams.tensors(f)]


def unflatten(kinds: Sequence[int], tensors: Sequence[Tensor]) -> list:
    """The fields again, from their kinds and the tensors in wire order."""
    fields, it = [], iter(tensors)
    for kind in kinds:
        fields.append(None if kind == 0 else next(it) if kind == 1 else tuple(next(it) for _ in range(kind)))
    return fields


def make_message(direction: int, mb: int, a, b) -> ForwardMsg | BackwardMsg:
    """The message of ``direction`` whose two fields hold ``a`` and ``b``."""
    return ForwardMsg(mb, a, b) if direction == FORWARD else BackwardMsg(mb, a, b)


def message_fields(msg: ForwardMsg | BackwardMsg) -> tuple:
    """The two fields of a message, in wire order (each None, a tensor or a pair)."""
    return (msg.activation, msg.labels) if isinstance(msg, ForwardMsg) else (msg.grad, msg.activation)


def message_tensors(msg: ForwardMsg | BackwardMsg) -> list[Tensor]:
    """Every tensor of a message, in wire order."""
    return flatten(message_fields(msg))[1]
