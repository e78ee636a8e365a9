"""How a stage's phases execute: ``eager`` (the worker's own code), ``static`` or ``graphs``.

On a GPU the host, not the device, sets a pipeline's pace: an eager PETRA tick is thousands of
Python calls (module calls, autograd, one optimizer per stage) for a few milliseconds of kernels.
A CUDA graph replays a phase's kernels with one call. A graph replays fixed addresses, so a phase
it can replay must read and write fixed buffers; ``static`` is that discipline, run eagerly, on
any device; ``graphs`` captures it once per stage and phase and replays it every tick after.

Each stage copy has three phases (:class:`StaticPhases`):

* **forward**: the stage's compute on its input, statistics frozen (its policy's
  ``forward_compute``); what the policy keeps is recorded apart, in Python;
* **backward**: the rebuild of the local graph (reconstruction from the output, or recomputation
  from the kept input) and the backpropagation into the weights' gradients; for the head, its
  forward, loss and backward together (they run in one tick under every method, so the head keeps
  its input and builds its graph at the backward: ``KeepInputForHead``);
* **step**: the optimizer's step and the gradients' zeroing.

The discipline (:class:`StaticCall`): inputs are copied into buffers of their first signature
(shape, strides, dtype, device) and outputs cloned out; gradients are allocated once and
accumulated in place (0 + g = g: the bits of the eager first assignment, a -0.0 gradient aside,
which becomes +0.0); the optimizer is the eager one, whose learning rates are Python floats a
graph bakes into its kernels, so a step's graph belongs to its learning rates (``StaticCall``'s
``key``): where the schedule changes them (warm-up, a milestone) the step runs eagerly again until
it is captured anew, and a schedule that changes them every step never captures its step. (Torch's
fused optimizers take a device learning rate, but their kernels round differently from the
foreach and per-tensor ones on small tensors: not the eager bits.) So ``static`` gives the bits of
``eager`` (tests/test_phases.py), and ``graphs`` those of ``static`` (a GPU test).

What stays eager, and is said: an input whose signature differs from the first (a last partial
batch) runs the same compute directly on its tensors (counted in ``StaticCall.unbuffered``); the
first ``warmup`` calls of a graphed phase run eagerly on the phase's side stream (the lazy
initialisation a capture must not see: cuDNN's autotuning, cuBLAS workspaces, the optimizer's
momentum buffers) before it is captured. Static phases serve the methods whose stages keep their
input or nothing (PETRA, DSP, reversible backprop): a kept autograd graph (backprop, delayed
gradients, local learning) lives across ticks outside any buffer. One replica per pipeline:
replica rules rewrite gradients and weights between a stage's phases.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..methods import Method
from ..methods.storage import KeepGraph, KeepInputForHead, StoragePolicy
from ..models import streams
from ..models.streams import Activation
from ..precision import compute, widen

if TYPE_CHECKING:
    from .worker import StageWorker

PHASES = ("eager", "static", "graphs")
WARMUP_CALLS = 2  # eager calls of a graphed phase before its capture


def check_phases(phases: str, method: Method, *, replicas: int, device: torch.device | None = None) -> str:
    """``phases`` if ``method`` on ``replicas`` replicas (on ``device``, if known) can run them; one line otherwise."""
    if phases not in PHASES:
        raise ValueError(f"phases={phases!r} is not allowed; allowed: {', '.join(PHASES)}")
    if phases == "eager":
        return phases
    if not runs_static(method):
        allowed = ", ".join(static_methods())
        raise ValueError(
            f"phases={phases!r} runs methods whose stages keep their input or nothing ({allowed}); "
            f"{method.name!r} keeps graphs across ticks: use phases='eager'"
        )
    if replicas != 1:
        raise ValueError(f"phases={phases!r} runs one replica per pipeline, not {replicas}: use phases='eager'")
    if phases == "graphs" and device is not None and device.type != "cuda":
        raise ValueError(f"phases='graphs' captures CUDA graphs, and the stages are on {device.type}: use 'static'")
    return phases


def runs_static(method: Method) -> bool:
    """Can static phases run ``method``? Its stages' policies split bookkeeping from compute, and
    its head keeps its graph within the tick (which ``KeepInputForHead`` then builds at the backward)."""
    return method.reversible.static and method.other.static and method.head is KeepGraph


def static_methods() -> list[str]:
    """The methods static phases can run."""
    from ..methods import METHODS

    return [m.name for m in METHODS.values() if runs_static(m)]


def static_storage(policy: StoragePolicy, *, last: bool) -> StoragePolicy:
    """The policy a stage runs under static phases: its own, the head's keeping its input."""
    return KeepInputForHead() if last else policy


# ---- one phase on fixed buffers -----------------------------------------------------------------
Inputs = Sequence[Tensor | None]


def _signature(inputs: Inputs) -> tuple:
    return tuple([None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in inputs])


class _Slot:
    """The fixed buffers of one input signature, and its graph once captured."""

    def __init__(self, inputs: Inputs):
        self.inputs = [
            None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
            for t in inputs
        ]
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: list[Tensor | None] = []

    def copy_in(self, inputs: Inputs) -> None:
        for buffer, t in zip(self.inputs, inputs):
            if buffer is not None:
                buffer.copy_(t, non_blocking=True)


class StaticCall:
    """``fn`` (a list of tensors -> a list of tensors, or None) on fixed buffers: the inputs copied
    in, ``fn`` run (``graphs``: after ``warmup`` eager calls, captured once and replayed), the
    outputs cloned out, so a caller may keep them while the next call overwrites the buffers."""

    def __init__(
        self,
        fn: Callable[[list], list],
        *,
        graphs: bool,
        name: str,
        device: torch.device | None = None,
        warmup: int = WARMUP_CALLS,
    ):
        """``device``: where ``fn`` runs (``graphs``: a CUDA device, whose streams it uses)."""
        self.fn, self.graphs, self.name, self.warmup, self.device = fn, graphs, name, warmup, device
        self.slot: _Slot | None = None  # the first signature's: the run's static shape
        self.signature: tuple = ()
        self.key: tuple = ()
        self.unbuffered = 0  # calls with another signature (a last partial batch), run directly
        self.stream = torch.cuda.Stream(device) if graphs else None  # warm-up and capture, on fn's device

    def reset(self) -> None:
        """Forget the buffers and the graph (after a load replaced the tensors the graph read)."""
        self.slot = None

    def __call__(self, inputs: Inputs = (), key: tuple = ()) -> list[Tensor | None]:
        """``key``: Python values ``fn`` bakes into its kernels (a step's learning rates): a new key
        starts afresh (buffers, warm-up, capture), the old graph dropped."""
        signature = _signature(inputs)
        if self.slot is None or key != self.key:
            self.slot, self.signature, self.key = _Slot(inputs), signature, key
        elif signature != self.signature:
            self.unbuffered += 1
            if self.unbuffered == 1:
                warnings.warn(f"{self.name}: an input of another shape than the first runs eagerly", stacklevel=2)
            return self.fn(list(inputs))
        slot = self.slot
        slot.copy_in(inputs)
        slot.calls += 1
        if not self.graphs:
            outputs = self.fn(slot.inputs)
        elif slot.graph is None and slot.calls <= self.warmup:
            outputs = self._on_side_stream(slot)
        else:
            with torch.cuda.device(self.device):  # a graph replays on its device's current stream
                if slot.graph is None:
                    slot.graph, slot.outputs = self._capture(slot)
                slot.graph.replay()
            outputs = slot.outputs
        return [None if t is None else t.clone() for t in outputs]

    def _on_side_stream(self, slot: _Slot) -> list[Tensor | None]:
        """An eager call on the stream the capture will use, ordered with the caller's stream both ways."""
        caller = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(caller)
        with torch.cuda.stream(self.stream):
            outputs = self.fn(slot.inputs)
        caller.wait_stream(self.stream)
        for t in outputs:
            if t is not None:
                t.record_stream(caller)  # freed after the caller's clone, not before
        return outputs

    def _capture(self, slot: _Slot) -> tuple[torch.cuda.CUDAGraph, list[Tensor | None]]:
        """Record ``fn`` on the buffers (nothing runs: the caller replays it at once). A private memory
        pool per graph; errors only for this thread's unsafe calls (a loader or receiver thread may
        work meanwhile)."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream, capture_error_mode="thread_local"):
            outputs = self.fn(slot.inputs)
        return graph, list(outputs)


# ---- a stage's three phases -----------------------------------------------------------------------
def _flat(a: Activation | None, n: int) -> list[Tensor | None]:
    return [None] * n if a is None else list(streams.tensors(a))


def _unflat(ts: list) -> Activation | None:
    """The activation of ``ts``: a pair of streams for two tensors, one tensor for one."""
    if any([t is None for t in ts]):
        return None
    return tuple(ts) if len(ts) > 1 else ts[0]


class StaticPhases:
    """One stage copy's forward, backward and step on fixed buffers (module docstring)."""

    def __init__(self, worker: StageWorker, *, graphs: bool):
        self.worker = worker
        j = worker.index
        d = worker.device
        self.forward_call = StaticCall(self._forward, graphs=graphs, name=f"stage {j} forward", device=d)
        self.backward_call = StaticCall(self._backward, graphs=graphs, name=f"stage {j} backward", device=d)
        self.step_call = StaticCall(self._step, graphs=graphs, name=f"stage {j} step", device=d)
        self.grads: list[Tensor] = []
        self._counts = (0, 0)  # tensors of the backward's start and gradient, set before each call
        self.prepare()

    def prepare(self) -> None:
        """Gradients allocated once (zeros in each parameter's layout; loaded ones kept); the graphs
        forgotten (they read the old tensors)."""
        w = self.worker
        params = [p for p in w.params if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.grads = [p.grad for p in params]
        for call in (self.forward_call, self.backward_call, self.step_call):
            call.reset()

    @property
    def unbuffered(self) -> int:
        """Calls that ran directly on their tensors (another shape than the run's first)."""
        return sum(c.unbuffered for c in (self.forward_call, self.backward_call, self.step_call))

    # ---- the phases, as the worker calls them ----------------------------------------------------
    def forward(self, mb: int, x: Activation) -> Activation | None:
        """The forward of ``mb``: recorded by the policy, computed on the buffers."""
        w = self.worker
        w.storage.forward_record(mb, x)
        if w.is_last:
            return None
        return _unflat(self.forward_call(_flat(x, 0)))

    def backward(self, mb: int, received: Activation | None, grad: Activation | None, labels: Tensor | None):
        """Rebuild and backpropagate ``mb``; (the input's gradient, the rebuilt input, the head's loss
        and sums), each None where there is none."""
        w = self.worker
        start = w.storage.backward_start(mb, received)
        n = len(streams.tensors(start))
        self._counts = (n, len(streams.tensors(grad)))  # how _backward splits its flat inputs
        out = self.backward_call([*streams.tensors(start), *streams.tensors(grad), labels])
        input_grad = _unflat(out[:n]) if w.input_grad else None
        input_value = _unflat(out[n : 2 * n]) if w.send_input_back else None
        loss, sums = out[2 * n], out[2 * n + 1]
        return input_grad, input_value, loss, sums

    def step(self, apply: bool = True) -> None:
        """The optimizer's step (a graph per set of learning rates), and the gradients zeroed;
        ``apply`` False (a replica rule's choice): only the zeroing."""
        if apply:
            self.step_call(key=tuple([group["lr"] for group in self.worker.optimizer.param_groups]))
        else:
            self.zero_grads()

    def zero_grads(self) -> None:
        if self.grads:
            torch._foreach_zero_(self.grads)

    # ---- the compute each phase runs (what a graph captures) -------------------------------------
    def _forward(self, inputs: list) -> list:
        w = self.worker
        x = _unflat(inputs)
        with compute(w.precision, w.device):
            y = w.storage.forward_compute(w.stage, x)
        return list(streams.tensors(streams.apply(widen, y)))

    def _backward(self, inputs: list) -> list:
        w = self.worker
        n_start, n_grad = self._counts
        start = _unflat(inputs[:n_start])
        grad = _unflat(inputs[n_start : n_start + n_grad]) if n_grad else None
        labels = inputs[n_start + n_grad]
        with compute(w.precision, w.device):
            graph = w.storage.graph_from(w.stage, start, input_grad=w.input_grad)
        loss = sums = None
        if w.is_last:
            output = graph.output
            loss = w.objective.loss(output, labels)
            (loss / w.k).backward()
            loss, sums = loss.detach(), w.objective.minibatch_sums(output.detach(), labels)
        else:
            w.storage.backward(w.stage, graph, grad, None, w.k, w.params)
        w.storage.hand_gradients(graph, w.params)
        input_grad = _flat(graph.input_grad(), n_start) if w.input_grad else [None] * n_start
        input_value = _flat(graph.input_value(), n_start) if w.send_input_back else [None] * n_start
        return [*input_grad, *input_value, loss, sums]

    def _step(self, inputs: list) -> list:
        self.worker.optimizer.step()
        self.zero_grads()
        return []
