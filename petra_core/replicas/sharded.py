"""ZeRO-1 over the replicas of one stage: each replica keeps the optimizer state of 1/R of it.

The stage's parameters, in the order of its optimizer's parameter groups, form one flat vector of
n scalars (:class:`FlatLayout`), cut into R contiguous slices of S = ceil(n / R) scalars (the last
padded with zeros up to S, as ACCO's public code pads its buffer). Replica r keeps a float copy of
slice r (its *shard*) and an optimizer of the stage's class and hyper-parameters over it only
(:class:`ShardedOptimizer`); a piece of the shard inside parameter group g takes group g's
settings (no weight decay on batch-norm parameters and biases, as everywhere). A step is:
reduce-scatter of the flat gradient (replica r receives the mean of slice r), the shard's
optimizer step, all-gather of the shards into every replica's parameters.

SGD and AdamW are element-wise, and torch computes an element the same way whatever slice of a
tensor it sits in, so the sharded step gives the unsharded step's bits (``tests/test_acco.py``
checks both optimizers, on slices that cut tensors anywhere). A stage copy never steps its own
optimizer under a sharded rule: that optimizer only carries the learning-rate schedule (its
``lr``), so it holds no state, and the per-replica optimizer state is the shard's alone.
"""

from __future__ import annotations

import copy as copying

import torch
from torch import Tensor, nn

from ..optim import kind_of
from .rule import flat_grads

# the keys of a parameter group that are not hyper-parameters of the optimizer's update
_NOT_SETTINGS = ("params", "initial_lr")


class FlatLayout:
    """Where each parameter of a stage copy sits in its flat vector, and the R slices of it.

    Parameters are laid out in the order of ``optimizer.param_groups`` (group 0's, then group
    1's, ...), so each group is one contiguous range and a shard meets each group in one piece."""

    def __init__(self, optimizer: torch.optim.Optimizer, replicas: int):
        self.params: list[nn.Parameter] = [p for g in optimizer.param_groups for p in g["params"]]
        self.groups: list[tuple[int, int]] = []  # each parameter group's [start, end) in the flat vector
        start = 0
        for g in optimizer.param_groups:
            end = start + sum(p.numel() for p in g["params"])
            self.groups.append((start, end))
            start = end
        self.n, self.replicas = start, replicas
        self.S = max(1, -(-self.n // replicas))  # slice length: ceil(n / R)

    def slice(self, replica: int) -> tuple[int, int]:
        """Replica ``replica``'s [lo, hi) of the unpadded vector (empty past the end)."""
        lo = min(self.n, replica * self.S)
        return lo, min(self.n, lo + self.S)

    def _padded(self, flat: Tensor) -> Tensor:
        """``flat`` (n floats) with zeros up to R·S."""
        pad = self.replicas * self.S - self.n
        return torch.cat([flat, flat.new_zeros(pad)]) if pad else flat

    def values(self) -> Tensor:
        """The parameters as one padded flat vector (R·S floats)."""
        return self._padded(torch.cat([p.detach().reshape(-1) for p in self.params]))

    def grads(self) -> Tensor:
        """The gradients as one padded flat vector (:func:`~.rule.flat_grads`: zeros where none);
        :func:`~.rule.set_grads` writes one back."""
        return self._padded(flat_grads(self.params))

    @torch.no_grad()
    def load(self, flat: Tensor) -> None:
        """Write a flat vector into the parameters (whatever their memory formats)."""
        offset = 0
        for p in self.params:
            n = p.numel()
            p.copy_(flat[offset : offset + n].view(p.shape))
            offset += n


class ShardedOptimizer:
    """Replica ``replica``'s shard of a stage copy's flat parameters and the optimizer of it: the
    class of ``optimizer`` (the copy's own), its defaults and each group's settings."""

    def __init__(self, optimizer: torch.optim.Optimizer, layout: FlatLayout, replica: int):
        self.layout, self.replica = layout, replica
        self.lo, self.hi = layout.slice(replica)
        values = layout.values()
        self.pieces: list[tuple[int, int, int]] = []  # (source group, start, end) of the shard, flat indices
        groups = []
        for gi, (a, b) in enumerate(layout.groups):
            lo, hi = max(a, self.lo), min(b, self.hi)
            if lo < hi:
                tensor = values[lo:hi].clone().requires_grad_(True)
                self.pieces.append((gi, lo, hi))
                settings = {
                    k: v
                    for k, v in optimizer.param_groups[gi].items()
                    if k not in _NOT_SETTINGS and k in optimizer.defaults
                }
                groups.append({"params": [tensor], **settings})
        self.tensors: list[Tensor] = [g["params"][0] for g in groups]
        # built as the copy's own was, from its declared options (each group carries its settings);
        # a replica whose slice is past the end (n < R) keeps nothing and steps nothing
        kind = kind_of(optimizer)
        self.optimizer = kind.build(groups, **{k: optimizer.defaults[k] for k in kind.options}) if groups else None

    def shard(self) -> Tensor:
        """This replica's slice of the parameters, padded to S floats."""
        parts = [t.detach() for t in self.tensors]
        pad = self.layout.S - (self.hi - self.lo)
        if pad or not parts:
            like = self.layout.params[0]
            parts.append(torch.zeros(pad, dtype=like.dtype, device=like.device))
        return torch.cat(parts)

    def step(self, grad: Tensor, lrs: list[float]) -> Tensor:
        """One optimizer step of the shard with its slice ``grad`` (S floats) at the learning rates
        ``lrs`` (one per source parameter group, read from the schedule when the step was asked
        for); returns the updated shard."""
        if self.optimizer is not None:
            for (gi, lo, hi), tensor, group in zip(self.pieces, self.tensors, self.optimizer.param_groups):
                group["lr"] = lrs[gi]
                tensor.grad = grad[lo - self.lo : hi - self.lo].clone()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return self.shard()

    # ---- a step to be thrown away (ACCO's tentative round, weight prediction) ----------------------
    def snapshot(self) -> tuple[list[Tensor], dict]:
        return [t.detach().clone() for t in self.tensors], copying.deepcopy(self.state_dict()["optimizer"])

    @torch.no_grad()
    def restore(self, snap: tuple[list[Tensor], dict]) -> None:
        values, state = snap
        for t, v in zip(self.tensors, values):
            t.copy_(v)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state)

    # ---- what it holds ------------------------------------------------------------------------------
    def state_bytes(self) -> int:
        """Bytes of optimizer state this replica keeps (momenta, Adam's moments and step counts)."""
        if self.optimizer is None:
            return 0
        return sum(
            v.numel() * v.element_size()
            for s in self.optimizer.state.values()
            for v in s.values()
            if isinstance(v, Tensor)
        )

    def state_dict(self) -> dict:
        return {
            "tensors": [t.detach().clone() for t in self.tensors],
            "optimizer": None if self.optimizer is None else self.optimizer.state_dict(),
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        for t, v in zip(self.tensors, state["tensors"]):
            t.copy_(v)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
