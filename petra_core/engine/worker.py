"""The stage worker: Algorithm 1 of the paper for one stage, independent of the transport.

Per tick a worker runs (at most) one forward and one backward, in that order and on the same
weights; it accumulates weight gradients over k backward passes (the loss is scaled by 1/k at
the head, so the accumulated gradient is the mean over the k minibatches) and then steps its
own optimizer and learning-rate schedule. What it keeps between forward and backward, and how
it gets its input back, is delegated to the method's storage policy.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..methods import Method
from ..models.stage import Stage
from .messages import BackwardMsg, ForwardMsg

StepHook = Callable[["StageWorker"], None]


class StageWorker:
    def __init__(
        self,
        stage: Stage,
        index: int,
        num_stages: int,
        method: Method,
        optimizer: torch.optim.Optimizer,
        scheduler,
        *,
        k: int,
        send_input_back: bool,
    ):
        self.stage, self.index, self.num_stages = stage, index, num_stages
        self.is_first, self.is_last = index == 0, index == num_stages - 1
        self.storage = method.storage_for(stage, last=self.is_last)
        self.optimizer, self.scheduler, self.k = optimizer, scheduler, k
        self.send_input_back = send_input_back  # does stage index-1 rebuild its input from its output?
        self.steps = 0  # optimizer steps taken = version of the weights
        self.pending = 0  # backward passes accumulated since the last step
        self.labels: dict[int, Tensor] = {}  # head only: labels of in-flight minibatches
        self.head_log: list[tuple[int, float, int, int]] = []  # head only: (mb, loss, correct, n)
        self.step_hooks: list[StepHook] = []  # called with gradients ready, before each step
        self.peak_kept: dict[str, int] = {}
        # a stage is placed on its device before its worker is built, and stays there
        self.params = list(stage.parameters())
        self.device = self.params[0].device

    # ---- the two halves of a tick -------------------------------------------------------------
    def forward(self, msg: ForwardMsg) -> ForwardMsg | None:
        x = msg.activation.to(self.device)  # stages may live on different GPUs; a no-op otherwise
        y = self.storage.forward(self.stage, msg.mb, x, input_grad=not self.is_first, version=self.steps)
        self._track_kept()
        if self.is_last:
            self.labels[msg.mb] = msg.labels.to(self.device)
            return None
        return ForwardMsg(msg.mb, y.detach(), msg.labels)

    def backward(self, mb: int, msg: BackwardMsg | None) -> BackwardMsg | None:
        received = msg.activation.to(self.device) if msg is not None and msg.activation is not None else None
        graph = self.storage.local_graph(self.stage, mb, received, input_grad=not self.is_first)
        if self.is_last:
            labels = self.labels.pop(mb)
            loss = F.cross_entropy(graph.output, labels)
            (loss / self.k).backward()
            correct = int((graph.output.detach().argmax(1) == labels).sum())
            self.head_log.append((mb, float(loss.detach()), correct, len(labels)))
        else:
            assert msg is not None and msg.mb == mb, f"stage {self.index}: expected gradient of minibatch {mb}"
            graph.backward(msg.grad.to(self.device))
        if graph.weights is not None:  # graph built on stashed weights: hand their grads to the stage
            for p, w in zip(self.params, graph.weights):
                if w.grad is not None:  # a stash is shared by its version's minibatches: take, then clear
                    p.grad = w.grad if p.grad is None else p.grad.add_(w.grad)
                    w.grad = None
        out = None
        if not self.is_first:
            grad = graph.input_grad()
            out = BackwardMsg(mb, grad, graph.input_value() if self.send_input_back else None)
        self.pending += 1
        if self.pending == self.k:
            self.step()
        return out

    # ---- optimisation ---------------------------------------------------------------------------
    def step(self) -> None:
        """Apply the accumulated gradient. A partial group (end of training) is averaged over what it has."""
        if self.pending == 0:
            return
        if self.pending < self.k:
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(self.k / self.pending)
        for hook in self.step_hooks:
            hook(self)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        self.pending = 0

    def _track_kept(self) -> None:
        for kind, n in self.storage.kept_bytes().items():
            self.peak_kept[kind] = max(self.peak_kept.get(kind, 0), n)

    # ---- checkpointing --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything of this stage that is not in the model's own state_dict."""
        return {
            "steps": self.steps, "pending": self.pending, "labels": dict(self.labels),
            "head_log": list(self.head_log), "peak_kept": dict(self.peak_kept),
            "grads": [None if p.grad is None else p.grad.clone() for p in self.stage.parameters()],
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "storage": self.storage.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore after the model's weights and buffers have been loaded (tensors saved on another
        device, e.g. a checkpoint read onto the CPU, are moved to this stage's)."""
        device = self.device
        self.steps, self.pending = state["steps"], state["pending"]
        self.labels, self.head_log = _to_device(dict(state["labels"]), device), list(state["head_log"])
        self.peak_kept = dict(state["peak_kept"])
        for p, g in zip(self.stage.parameters(), state["grads"]):
            p.grad = None if g is None else g.to(device, copy=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.storage.load_state_dict(self.stage, _to_device(state["storage"], device))

    def kept_bytes(self) -> dict[str, int]:
        """Bytes this stage keeps right now between forward and backward, by kind."""
        return self.storage.kept_bytes()


def _to_device(obj, device: torch.device):
    """``obj`` with every tensor in its dicts, lists and tuples on ``device`` (no copy if already there)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_to_device(v, device) for v in obj)
    return obj
