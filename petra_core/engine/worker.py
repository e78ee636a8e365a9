"""The stage worker: Algorithm 1 of the paper for one stage, independent of the transport.

Per tick a worker runs at most one forward and one backward, on the same weights; after k
backward passes (the head scales the loss by 1/k: the mean over k minibatches) it is due for an
optimizer *step*, which the runner takes at the end of the tick, after the replica rule has had
its say. A backward is two calls: :meth:`StageWorker.rebuild` (the local graph: reconstruction,
recomputation or the kept graph) and :meth:`StageWorker.backward` through it. What a worker keeps
between forward and backward, and how gradients reach its weights, is its storage policy's
business. The head's loss and what it counts of a minibatch are its model family's (the head
stage's ``objective``): the engine knows no task. Nothing here waits for the device: the head
keeps its loss on the device (:class:`HeadLog`) and inputs from another GPU are copied
asynchronously.
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from typing import NamedTuple

import torch
from torch import Tensor

from ..methods import StoragePolicy
from ..methods.prediction import WeightPredictor
from ..models import streams
from ..models.stage import LocalGraph, Stage
from ..models.streams import Activation
from ..precision import check_precision, compute, widen
from .messages import BackwardMsg, ForwardMsg


class HeadRecord(NamedTuple):
    """What the head saw of one minibatch: its mean loss, its family's additive sums
    (``ModelFamily.train_sums``, e.g. the correct predictions) and its number of samples."""

    mb: int
    loss: float
    sums: tuple[float, ...]
    n: int


class HeadLog:
    """The head's per-minibatch loss and sums, kept on the device until :meth:`records` copies
    everything unread in one transfer: read it once per logging interval, not every tick."""

    def __init__(self):
        self._read: list[HeadRecord] = []
        self._unread: list[tuple[int, Tensor, Tensor, int]] = []

    def add(self, mb: int, loss: Tensor, sums: Tensor, n: int) -> None:
        self._unread.append((mb, loss, sums, n))

    def records(self) -> list[HeadRecord]:
        if self._unread:
            losses = torch.stack([loss for _, loss, _, _ in self._unread])
            sums = torch.stack([s for _, _, s, _ in self._unread]).to(losses.dtype)
            rows = torch.cat([losses[:, None], sums], 1).tolist()
            self._read += [HeadRecord(mb, row[0], tuple(row[1:]), n) for (mb, _, _, n), row in zip(self._unread, rows)]
            self._unread.clear()
        return self._read

    def state_dict(self) -> list[tuple]:
        return [tuple(r) for r in self.records()]

    def load_state_dict(self, state: list[tuple]) -> None:
        self._read, self._unread = [_record(*r) for r in state], []


def _record(mb: int, loss: float, sums, n: int) -> HeadRecord:
    """A saved record; one a checkpoint from before model families wrote has a number, its correct
    predictions (the image family's one sum), where the sums are."""
    return HeadRecord(mb, loss, tuple(sums) if isinstance(sums, (tuple, list)) else (float(sums),), n)


class StageWorker:
    def __init__(
        self,
        stage: Stage,
        index: int,
        num_stages: int,
        storage: StoragePolicy,
        optimizer: torch.optim.Optimizer,
        scheduler,
        *,
        k: int,
        send_input_back: bool,
        tensor_offset: int,
        tensors_total: int,
        joins_next: bool,
        replica: int = 0,
        precision: str = "fp32",
        batches_per_epoch: float | None = None,
        predictor: WeightPredictor | None = None,
    ):
        self.stage, self.index, self.num_stages, self.replica = stage, index, num_stages, replica
        self.batches_per_epoch = batches_per_epoch  # where epochs start, for rules that count steps per epoch
        self.precision = check_precision(precision)  # forward and rebuild run under it (engine.precision)
        self.is_first, self.is_last = index == 0, index == num_stages - 1
        self.storage = storage
        self.optimizer, self.scheduler, self.k = optimizer, scheduler, k
        self.send_input_back = send_input_back  # does stage index-1 rebuild its input from its output?
        self.input_grad = not self.is_first and storage.gradient_out  # is a gradient sent back?
        self.gradient_in = not self.is_last and storage.gradient_in  # does one come from the next stage?
        self.joins_next = joins_next  # may the next stage's graph go on into this one's? (assembly.joined_stages)
        self.steps = 0  # optimizer steps taken = version of the weights
        self.pending = 0  # backward passes accumulated since the last step
        self.labels: dict[int, Tensor] = {}  # head only: labels of in-flight minibatches
        self.head_log = HeadLog() if self.is_last else None
        self.objective = stage.objective if self.is_last else None  # the model family's loss and sums
        if self.is_last and self.objective is None:
            raise ValueError(
                f"the last stage ({type(stage).__name__}) has no objective: build the model with its "
                f"family (petra_core.families: build(arch, ...), or ModelFamily.staged)"
            )
        self.peak_kept: dict[str, int] = {}
        # a stage is placed on its device before its worker is built, and stays there
        self.params = list(stage.parameters())
        self.device = self.params[0].device
        # place among the model's parameter tensors, in network order (rules such as wash treat them by depth)
        self.tensor_offset, self.tensors_total = tensor_offset, tensors_total
        self.predictor = predictor  # forwards at predicted weights (methods/prediction.py), or None
        self.phases = None  # StaticPhases when the phases run on fixed buffers (engine/phases.py), else eager

    def run_static(self, *, graphs: bool) -> None:
        """Run this stage's phases on fixed buffers (``graphs``: captured as CUDA graphs), from now on."""
        from .phases import StaticPhases

        self.phases = StaticPhases(self, graphs=graphs)

    # ---- the two halves of a tick -------------------------------------------------------------
    def _here(self, a: Activation) -> Activation:
        """``a`` on this stage's device (an asynchronous copy when it comes from another GPU)."""
        return streams.apply(lambda t: t if t.device == self.device else t.to(self.device, non_blocking=True), a)

    def forward(self, msg: ForwardMsg, attached: bool = False) -> ForwardMsg | None:
        """``attached``: hand the output on with its graph (the next stage joins it, :attr:`joins_next`)."""
        x = self._here(msg.activation)
        with self.predictor.shifted() if self.predictor is not None else nullcontext():
            if self.phases is not None:
                y = self.phases.forward(msg.mb, x)
            else:
                with compute(self.precision, self.device):
                    y = self.storage.forward(self.stage, msg.mb, x, input_grad=self.input_grad, version=self.steps)
        self._track_kept()
        if self.is_last or self.storage.needs_labels:
            self.labels[msg.mb] = self._here(msg.labels)
        # never 16-bit on the wire: the residual stream a reversible stage rebuilds its input from
        # stays float32 under bf16 (a no-op otherwise)
        out = streams.attached(streams.apply(widen, y)) if attached else streams.apply(lambda t: widen(t.detach()), y)
        return None if self.is_last else ForwardMsg(msg.mb, out, msg.labels)

    def rebuild(self, mb: int, msg: BackwardMsg | None) -> LocalGraph:
        """The local graph of minibatch ``mb`` (``msg``: what the next stage sent back, if anything)."""
        received = self._here(msg.activation) if msg is not None and msg.activation is not None else None
        if self.phases is not None:  # rebuilt with the backward, in one call (StaticPhases.backward)
            return _Deferred(received)
        with compute(self.precision, self.device):
            return self.storage.local_graph(self.stage, mb, received, input_grad=self.input_grad)

    def backward(self, mb: int, msg: BackwardMsg | None, graph: LocalGraph) -> BackwardMsg | None:
        """Backpropagate ``graph`` (from :meth:`rebuild`) into the weights' gradients; the message
        for the previous stage, if one goes back."""
        labels = self.labels.pop(mb, None)
        if self.phases is not None:
            return self._static_backward(mb, msg, graph, labels)
        if self.is_last:
            output = graph.output
            loss = self.objective.loss(output, labels)
            (loss / self.k).backward()
            self.head_log.add(mb, loss.detach(), self.objective.minibatch_sums(output.detach(), labels), len(labels))
        else:
            self._check_gradient_of(mb, msg)
            if not self.gradient_in:
                self.storage.backward(self.stage, graph, None, labels, self.k, self.params)
            elif msg.grad is not None:  # None: the next stage's graph joined this one, whose backward has run
                self.storage.backward(self.stage, graph, self._here(msg.grad), labels, self.k, self.params)
        self.storage.hand_gradients(graph, self.params)
        out = None
        if self.input_grad:
            out = BackwardMsg(mb, graph.input_grad(), graph.input_value() if self.send_input_back else None)
        self.pending += 1
        return out

    def _static_backward(self, mb: int, msg: BackwardMsg | None, graph: _Deferred, labels) -> BackwardMsg | None:
        self._check_gradient_of(mb, msg)
        grad = self._here(msg.grad) if self.gradient_in else None
        input_grad, input_value, loss, sums = self.phases.backward(mb, graph.received, grad, labels)
        if self.is_last:
            self.head_log.add(mb, loss, sums, len(labels))
        self.pending += 1
        return BackwardMsg(mb, input_grad, input_value) if self.input_grad else None

    def _check_gradient_of(self, mb: int, msg: BackwardMsg | None) -> None:
        if self.gradient_in and (msg is None or msg.mb != mb):
            raise RuntimeError(
                f"stage {self.index}: expected the gradient of minibatch {mb}, got {None if msg is None else msg.mb}"
            )

    @property
    def step_due(self) -> bool:
        """Has this stage accumulated its k backward passes?"""
        return self.pending == self.k

    # ---- optimisation ---------------------------------------------------------------------------
    def complete_partial_group(self) -> None:
        """End of training: a partial accumulation group becomes the mean over what it has."""
        if 0 < self.pending < self.k:
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(self.k / self.pending)

    def step(self, apply: bool = True) -> None:
        """Apply the accumulated gradient (the runner completes a partial group first). ``apply``
        False (a replica rule's choice): leave weights and optimizer state as they are; the
        learning-rate schedule still advances."""
        if self.pending == 0:
            return
        predicting = apply and self.predictor is not None
        if predicting:
            self.predictor.before_step()
        if self.phases is not None:  # the step and the gradients' zeroing on fixed buffers
            self.phases.step(apply)
        else:
            if apply:
                self.optimizer.step()
            for p in self.params:  # the optimizer's zero_grad(set_to_none=True), without its wrapper (0.02 ms a stage)
                p.grad = None
        if predicting:
            self.predictor.after_step()
        if apply:
            self.scheduler.step()
        else:
            with warnings.catch_warnings():  # torch warns of a schedule stepped before its optimizer
                warnings.simplefilter("ignore", UserWarning)
                self.scheduler.step()
        self.steps += 1
        self.pending = 0

    def _track_kept(self) -> None:
        kept = self.storage.kept_bytes()
        if self.predictor is not None:
            kept["weight_prediction"] = self.predictor.nbytes()
        for kind, n in kept.items():
            self.peak_kept[kind] = max(self.peak_kept.get(kind, 0), n)

    # ---- checkpointing --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything of this stage that is not in the model's own state_dict."""
        return {
            "steps": self.steps,
            "pending": self.pending,
            "labels": dict(self.labels),
            "head_log": self.head_log.state_dict() if self.head_log is not None else [],
            "peak_kept": dict(self.peak_kept),
            "grads": [None if p.grad is None else p.grad.clone() for p in self.params],
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "storage": self.storage.state_dict(),
            **({"predictor": self.predictor.state_dict()} if self.predictor is not None else {}),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore after the model's weights and buffers have been loaded (tensors saved on another
        device, e.g. a checkpoint read onto the CPU, are moved to this stage's)."""
        device = self.device
        self.steps, self.pending = state["steps"], state["pending"]
        self.labels = to_device(dict(state["labels"]), device)
        if self.head_log is not None:
            self.head_log.load_state_dict(state["head_log"])
        self.peak_kept = dict(state["peak_kept"])
        for p, g in zip(self.params, state["grads"]):
            p.grad = None if g is None else g.to(device, copy=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.storage.load_state_dict(self.stage, to_device(state["storage"], device))
        if self.predictor is not None:
            if "predictor" not in state:
                raise ValueError(
                    f"stage {self.index}: the checkpoint was saved without weight prediction "
                    f"(its last update is not in it); resume with weight_prediction=0"
                )
            self.predictor.load_state_dict(to_device(state["predictor"], device))
        if self.phases is not None:  # the loaded gradients and optimizer state are the buffers now
            self.phases.prepare()


class _Deferred(NamedTuple):
    """A static stage's rebuild, left to its backward (what the next stage sent back, if anything)."""

    received: Activation | None


def to_device(obj, device: torch.device):
    """``obj`` with every tensor in its dicts, lists and tuples on ``device`` (no copy if already there)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(to_device(v, device) for v in obj)
    return obj
