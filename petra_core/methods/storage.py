"""Storage policies: what a stage keeps between a minibatch's forward and its backward.

A policy owns its whole backward contract, so the worker, the placement and the accounting ask
it rather than inspect its type:

* what it keeps (``keeps``: the kinds its ``kept_bytes()`` reports);
* whether the backward message it receives must carry this stage's output (``needs_output_back``);
* whether it runs F a second time at backward (``recomputes``: Table 1's 4 units instead of 3);
* how it gets the local graph (input leaves -> output) back (``local_graph``);
* how that graph hands its gradients to the stage's parameters (``hand_gradients``).

The policies:

* :class:`KeepGraph`   — keep the forward's autograd graph (backprop).
* :class:`StashWeights` — keep the graph, built on a stashed copy of the weights, so the backward
  uses the version the forward used (delayed gradients, PipeDream).
* :class:`KeepInput`   — keep the input, recompute with the current weights (checkpointing; DSP;
  non-reversible stages under PETRA and reversible backprop).
* :class:`Reconstruct` — keep nothing; rebuild the input from the output the next stage sends
  back, with the current weights (reversible stages under PETRA and reversible backprop).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.func import functional_call

from ..batchnorm import frozen_running_stats
from ..models import streams
from ..models.stage import LocalGraph, Stage
from ..models.streams import Activation


class StoragePolicy:
    """Base class. Subclasses keep per-minibatch records keyed by minibatch id."""

    name = "?"
    keeps: tuple[str, ...] = ()  # what is held between forward and backward (the keys of kept_bytes())
    needs_output_back = False  # does the backward message have to carry this stage's output?
    recomputes = False  # does the backward evaluate F again (reconstruction or recomputation)?
    gradient_in = True  # does the backward need the gradient of the output, from the next stage?
    gradient_out = True  # does the backward send the input's gradient to the previous stage?
    needs_labels = False  # does the backward need the minibatch's labels (a local loss)?
    # may its graph go on into the previous stage's? Only a graph of the live weights, whose backward
    # needs nothing but the output's gradient (engine/assembly.py: joined_stages)
    joins = False
    # can its compute run on fixed buffers, apart from its bookkeeping (engine/phases.py: what a CUDA
    # graph replays)? Such a policy splits its forward into forward_record + forward_compute and its
    # local graph into backward_start + graph_from
    static = False

    def forward(self, stage: Stage, mb: int, x: Tensor, *, input_grad: bool, version: int) -> Tensor:
        raise NotImplementedError

    def local_graph(self, stage: Stage, mb: int, output: Tensor | None, *, input_grad: bool) -> LocalGraph:
        raise NotImplementedError

    # ---- the split of a static policy (``static``): bookkeeping apart from compute ----------------
    def forward_record(self, mb: int, x: Activation) -> None:
        """What the forward of ``mb`` keeps (no compute)."""
        raise NotImplementedError

    def forward_compute(self, stage: Stage, x: Activation) -> Activation | None:
        """The forward's compute alone (None: its output goes nowhere)."""
        raise NotImplementedError

    def backward_start(self, mb: int, output: Activation | None) -> Activation:
        """What the rebuild of ``mb`` starts from (``output``: what the next stage sent back); forgets ``mb``."""
        raise NotImplementedError

    def graph_from(self, stage: Stage, start: Activation, *, input_grad: bool) -> LocalGraph:
        """The rebuild's compute alone: the local graph from :meth:`backward_start`'s activation."""
        raise NotImplementedError

    def backward(
        self,
        stage: Stage,
        graph: LocalGraph,
        grad: Tensor | None,
        labels: Tensor | None,
        k: int,
        params: Sequence[Tensor] | None = None,
    ) -> None:
        """Backpropagate into the stage's parameters (and its input leaves, if they need a gradient).
        ``params``: the stage's parameters as its worker lists them once (walking the modules each
        backward costs more than a small stage's kernels); listed here if not given."""
        if graph.weights is None and params is None:
            params = tuple(stage.parameters())
        graph.backward(grad, graph.weights if graph.weights is not None else params)

    def hand_gradients(self, graph: LocalGraph, params: list[Tensor]) -> None:
        """After ``graph`` was backpropagated: make sure its weight gradients are in ``params``'
        ``.grad`` (a graph built on the live parameters already put them there)."""

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
    x: Activation
    version: int
    graph_bytes: int
    input_grad: bool


class KeepGraph(StoragePolicy):
    """Keep the forward's autograd graph; the backward runs it on the weights the forward used."""

    name = "graph"
    keeps = ("graph",)
    joins = True

    def __init__(self):
        self.records: dict[int, _Recorded] = {}
        self.stashes: dict[int, dict[str, Tensor]] = {}
        self._fixed: tuple[Tensor, ...] | None = None
        self._graph_bytes: dict[tuple, int] = {}  # input signature -> bytes a record holds

    def _weights(self, stage: Stage, version: int) -> dict[str, Tensor] | None:
        """The weights the forward of ``version`` runs on: None = the stage's own (live) ones."""
        return None

    def forward(self, stage, mb, x, *, input_grad, version):
        return self._record(stage, mb, x, input_grad, version)

    def _record(self, stage, mb, x, input_grad, version):
        # an input that arrives with its graph (the previous stage handed its output on attached:
        # assembly.joined_stages) is taken as it is, and the backward runs on through that stage
        joined = self.joins and any(t.requires_grad for t in streams.tensors(x))
        leaf = x if joined else streams.leaves(x, input_grad)
        weights = self._weights(stage, version)
        # what autograd saves depends only on the input's kind, shapes and dtypes (a stage's code,
        # placement and precision are fixed): measure it once per such signature, with hooks that
        # see every saved tensor, and run the later forwards of that signature without them
        signature = (
            tuple((t.shape, t.dtype, t.requires_grad) for t in streams.tensors(leaf)),
            weights is None,
            _autocast(streams.device(leaf).type),
        )
        graph_bytes = self._graph_bytes.get(signature)
        if graph_bytes is None:
            y, graph_bytes = self._measured_forward(stage, leaf, weights)
            self._graph_bytes[signature] = graph_bytes
        else:
            y = stage(leaf) if weights is None else functional_call(stage, weights, (leaf,))
        graph = LocalGraph(leaf, y, tuple(weights.values()) if weights is not None else None, joined)
        self.records[mb] = _Recorded(graph, streams.apply(Tensor.detach, x), version, graph_bytes, input_grad)
        return y

    def _measured_forward(self, stage, leaf, weights) -> tuple[Activation, int]:
        """The stage's forward, and the bytes its record holds: every tensor autograd saves that is
        not a parameter, a stash or a batch-norm statistic, plus the input leaves and the output."""
        if self._fixed is None:  # the stage's own tensors (it stays where it was placed)
            self._fixed = (*stage.parameters(), *stage.buffers())
        excluded = {t.untyped_storage().data_ptr() for t in self._fixed}
        if weights is not None:
            excluded |= {w.untyped_storage().data_ptr() for w in weights.values()}
        seen: dict[int, int] = {}

        def pack(t: Tensor) -> Tensor:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in excluded:
                seen[ptr] = t.untyped_storage().nbytes()
            # detached: a saved *output* returned as is would hold its own grad_fn, a cycle through
            # C++ that no gc breaks once a backward retains the graph (fg-local-w) or never runs
            return t.detach()

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = stage(leaf) if weights is None else functional_call(stage, weights, (leaf,))
        for t in (*streams.tensors(leaf), *streams.tensors(y)):  # held by the record whether or not autograd saved them
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return y, sum(seen.values())

    def local_graph(self, stage, mb, output, *, input_grad):
        return self.records.pop(mb).graph

    def kept_bytes(self):
        return {"graph": sum(r.graph_bytes for r in self.records.values())}

    def in_flight(self):
        return len(self.records)

    def state_dict(self):
        # a graph cannot be saved: keep its input and weight version, rebuild it on load
        return {
            "records": {
                mb: {"x": r.x, "version": r.version, "input_grad": r.input_grad} for mb, r in self.records.items()
            },
            "stashes": {v: {n: w.detach() for n, w in ws.items()} for v, ws in self.stashes.items()},
        }

    def load_state_dict(self, stage, state):
        self.records.clear()
        self.stashes = {
            v: {n: w.clone().requires_grad_(True) for n, w in ws.items()} for v, ws in state["stashes"].items()
        }
        with frozen_running_stats(stage):  # the forward already updated them before the checkpoint
            for mb in sorted(state["records"]):
                r = state["records"][mb]
                self._record(stage, mb, r["x"], r["input_grad"], r["version"])


def _autocast(device_type: str) -> bool:
    """Is autocast on for ``device_type`` (False on a device that has none, such as meta)?"""
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:
        return False


class StashWeights(KeepGraph):
    """Keep the graph, built on a stashed copy of the weights of the forward's version (PipeDream).

    Stashed versions are shared by every in-flight minibatch that used them, so a stage keeps
    ceil(in-flight / k) copies, not one per minibatch. The backward's weight gradients land on
    the stash and are handed to the stage's parameters.
    """

    name = "graph+stash"
    keeps = ("graph", "weight_stash")
    joins = False  # its graph is of a stashed copy of the weights

    def _weights(self, stage, version):
        if version not in self.stashes:
            self.stashes[version] = {
                name: p.detach().clone().requires_grad_(p.requires_grad) for name, p in stage.named_parameters()
            }
        return self.stashes[version]

    def local_graph(self, stage, mb, output, *, input_grad):
        record = self.records.pop(mb)
        if all(r.version != record.version for r in self.records.values()):
            del self.stashes[record.version]  # the graph still references the tensors it needs
        return record.graph

    def hand_gradients(self, graph, params):
        for p, w in zip(params, graph.weights):
            if w.grad is not None:  # a stash is shared by its version's minibatches: take, then clear
                p.grad = w.grad if p.grad is None else p.grad.add_(w.grad)
                w.grad = None

    def kept_bytes(self):
        one = next(iter(self.stashes.values()), {})  # every stash is a copy of all the stage's weights
        stash_bytes = len(self.stashes) * sum(streams.nbytes(w) for w in one.values())
        return {**super().kept_bytes(), "weight_stash": stash_bytes}


class KeepInput(StoragePolicy):
    """Buffer the input; recompute F with the current weights at backward (checkpointing)."""

    name = "input"
    keeps = ("input",)
    recomputes = True
    static = True

    def __init__(self):
        self.inputs: dict[int, Activation] = {}
        self.input_bytes = 0  # of self.inputs, kept up to date (read after every forward)

    def forward(self, stage, mb, x, *, input_grad, version):
        self.forward_record(mb, x)
        return self.forward_compute(stage, x)

    def local_graph(self, stage, mb, output, *, input_grad):
        return self.graph_from(stage, self.backward_start(mb, output), input_grad=input_grad)

    def forward_record(self, mb, x):
        self.inputs[mb] = streams.apply(Tensor.detach, x)
        self.input_bytes += streams.nbytes(x)

    def forward_compute(self, stage, x):
        with torch.no_grad(), frozen_running_stats(stage):
            return stage(x)

    def backward_start(self, mb, output):
        x = self.inputs.pop(mb)
        self.input_bytes -= streams.nbytes(x)
        return x

    def graph_from(self, stage, start, *, input_grad):
        return stage.rebuild(start, input_grad=input_grad)

    def kept_bytes(self):
        return {"input": self.input_bytes}

    def in_flight(self):
        return len(self.inputs)

    def state_dict(self):
        return {"inputs": dict(self.inputs)}

    def load_state_dict(self, stage, state):
        self.inputs = dict(state["inputs"])
        self.input_bytes = sum(streams.nbytes(x) for x in self.inputs.values())


@dataclass
class Reconstruct(StoragePolicy):
    """Keep nothing; invert the output sent back by the next stage, with the current weights."""

    name = "reconstruct"
    needs_output_back = True
    recomputes = True
    static = True
    _pending: set[int] = field(default_factory=set)

    def forward(self, stage, mb, x, *, input_grad, version):
        self.forward_record(mb, x)
        return self.forward_compute(stage, x)

    def local_graph(self, stage, mb, output, *, input_grad):
        return self.graph_from(stage, self.backward_start(mb, output), input_grad=input_grad)

    def forward_record(self, mb, x):
        self._pending.add(mb)

    def forward_compute(self, stage, x):
        with torch.no_grad(), frozen_running_stats(stage):
            return stage(x)

    def backward_start(self, mb, output):
        if output is None:
            raise RuntimeError(f"stage reconstructing minibatch {mb} received no output to invert")
        self._pending.discard(mb)
        return output

    def graph_from(self, stage, start, *, input_grad):
        return stage.reconstruct(start, input_grad=input_grad)

    def kept_bytes(self):
        return {}

    def in_flight(self):
        return len(self._pending)

    def state_dict(self):
        return {"pending": sorted(self._pending)}

    def load_state_dict(self, stage, state):
        self._pending = set(state["pending"])


class KeepInputForHead(KeepInput):
    """The head's storage under static phases (``engine/phases.py``): keep the input at the forward
    and build the graph at the backward, in the same tick (the head runs forward, loss and backward
    in one tick under every method). The graph is the forward's own, batch-norm statistics updated
    as :class:`KeepGraph`'s forward updates them: the same bits, with the whole head in one call a
    CUDA graph can replay. What it reports kept is its input, not a graph."""

    name = "input (head)"
    recomputes = False

    def forward_compute(self, stage, x):
        return None  # computed at the backward, in the same tick

    def graph_from(self, stage, start, *, input_grad):
        leaf = streams.leaves(start, input_grad)
        return LocalGraph(leaf, stage(leaf))
