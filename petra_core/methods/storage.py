"""Storage policies: what a stage keeps between a minibatch's forward and its backward.

Each policy answers two questions for one stage: what to keep at forward time, and how to get
the local graph (input leaves -> output) back at backward time.

* :class:`KeepGraph`   — keep the forward's autograd graph (backprop; delayed gradients, where
  the forward runs on a stashed copy of the weights so the backward uses the same version).
* :class:`KeepInput`   — keep the input, recompute with the current weights (checkpointing; DSP;
  non-reversible stages under PETRA and reversible backprop).
* :class:`Reconstruct` — keep nothing; rebuild the input from the output the next stage sends
  back, with the current weights (reversible stages under PETRA and reversible backprop).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.func import functional_call

from ..batchnorm import frozen_running_stats
from ..models.stage import LocalGraph, Stage


def tensor_bytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


class StoragePolicy:
    """Base class. Subclasses keep per-minibatch records keyed by minibatch id."""

    name = "?"
    needs_output_back = False  # does the backward message have to carry this stage's output?

    def forward(self, stage: Stage, mb: int, x: Tensor, *, input_grad: bool, version: int) -> Tensor:
        raise NotImplementedError

    def local_graph(self, stage: Stage, mb: int, output: Tensor | None, *, input_grad: bool) -> LocalGraph:
        raise NotImplementedError

    def kept_bytes(self) -> dict[str, int]:
        """Bytes held right now between forward and backward, by kind."""
        return {}

    def in_flight(self) -> int:
        """Minibatches forwarded but not yet backpropagated."""
        return 0

    def state_dict(self) -> dict:
        """What is kept, as tensors (checkpoints carry the in-flight state of the pipeline)."""
        return {}

    def load_state_dict(self, stage: Stage, state: dict) -> None:
        pass


@dataclass
class _Recorded:
    graph: LocalGraph
    x: Tensor
    version: int
    graph_bytes: int
    input_grad: bool


class KeepGraph(StoragePolicy):
    """Keep the forward graph; with ``stash`` the forward runs on a copy of the weights (PipeDream).

    Stashed weight versions are shared by every in-flight minibatch that used them, so a stage
    keeps ceil(in-flight / k) copies, not one per minibatch.
    """

    def __init__(self, stash: bool = False):
        self.stash = stash
        self.name = "graph+stash" if stash else "graph"
        self.records: dict[int, _Recorded] = {}
        self.stashes: dict[int, dict[str, Tensor]] = {}
        self._fixed: tuple[Tensor, ...] | None = None

    def _weights(self, stage: Stage, version: int) -> dict[str, Tensor]:
        if version not in self.stashes:
            self.stashes[version] = {
                name: p.detach().clone().requires_grad_(p.requires_grad) for name, p in stage.named_parameters()
            }
        return self.stashes[version]

    def forward(self, stage, mb, x, *, input_grad, version):
        return self._record(stage, mb, x, input_grad, version)

    def _record(self, stage, mb, x, input_grad, version):
        leaf = x.detach().requires_grad_(input_grad and x.is_floating_point())
        # parameters, stashes and batch-norm statistics are not activations; the output is kept
        if self._fixed is None:  # the stage's own tensors (it stays where it was placed)
            self._fixed = (*stage.parameters(), *stage.buffers())
        excluded = {t.untyped_storage().data_ptr() for t in self._fixed}
        weights = None
        if self.stash:
            weights = self._weights(stage, version)
            excluded |= {w.untyped_storage().data_ptr() for w in weights.values()}
        seen: dict[int, int] = {}

        def pack(t: Tensor) -> Tensor:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in excluded:
                seen[ptr] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = stage(leaf) if weights is None else functional_call(stage, weights, (leaf,))
        for t in (leaf, y):  # held by the record whether or not autograd saved them
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        graph = LocalGraph((leaf,), y, tuple(weights.values()) if weights is not None else None)
        self.records[mb] = _Recorded(graph, x.detach(), version, sum(seen.values()), input_grad)
        return y

    def local_graph(self, stage, mb, output, *, input_grad):
        record = self.records.pop(mb)
        if self.stash and all(r.version != record.version for r in self.records.values()):
            del self.stashes[record.version]
        return record.graph

    def kept_bytes(self):
        kept = {"graph": sum(r.graph_bytes for r in self.records.values())}
        if self.stash:
            kept["weight_stash"] = sum(tensor_bytes(w) for s in self.stashes.values() for w in s.values())
        return kept

    def in_flight(self):
        return len(self.records)

    def state_dict(self):
        # a graph cannot be saved: keep its input and weight version, rebuild it on load
        return {"records": {mb: {"x": r.x, "version": r.version, "input_grad": r.input_grad}
                            for mb, r in self.records.items()},
                "stashes": {v: {n: w.detach() for n, w in ws.items()} for v, ws in self.stashes.items()}}

    def load_state_dict(self, stage, state):
        self.records.clear()
        self.stashes = {v: {n: w.clone().requires_grad_(True) for n, w in ws.items()}
                        for v, ws in state["stashes"].items()}
        with frozen_running_stats(stage):  # the forward already updated them before the checkpoint
            for mb in sorted(state["records"]):
                r = state["records"][mb]
                self._record(stage, mb, r["x"], r["input_grad"], r["version"])


class KeepInput(StoragePolicy):
    """Buffer the input; recompute F with the current weights at backward (checkpointing)."""

    name = "input"

    def __init__(self):
        self.inputs: dict[int, Tensor] = {}

    def forward(self, stage, mb, x, *, input_grad, version):
        self.inputs[mb] = x.detach()
        with torch.no_grad(), frozen_running_stats(stage):
            return stage(x)

    def local_graph(self, stage, mb, output, *, input_grad):
        return stage.rebuild(self.inputs.pop(mb), input_grad=input_grad)

    def kept_bytes(self):
        return {"input": sum(tensor_bytes(x) for x in self.inputs.values())}

    def in_flight(self):
        return len(self.inputs)

    def state_dict(self):
        return {"inputs": dict(self.inputs)}

    def load_state_dict(self, stage, state):
        self.inputs = dict(state["inputs"])


@dataclass
class Reconstruct(StoragePolicy):
    """Keep nothing; invert the output sent back by the next stage, with the current weights."""

    name = "reconstruct"
    needs_output_back = True
    _pending: set[int] = field(default_factory=set)

    def forward(self, stage, mb, x, *, input_grad, version):
        self._pending.add(mb)
        with torch.no_grad(), frozen_running_stats(stage):
            return stage(x)

    def local_graph(self, stage, mb, output, *, input_grad):
        if output is None:
            raise RuntimeError(f"stage reconstructing minibatch {mb} received no output to invert")
        self._pending.discard(mb)
        return stage.reconstruct(output, input_grad=input_grad)

    def kept_bytes(self):
        return {}

    def in_flight(self):
        return len(self._pending)

    def state_dict(self):
        return {"pending": sorted(self._pending)}

    def load_state_dict(self, stage, state):
        self._pending = set(state["pending"])
