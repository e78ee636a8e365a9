"""Gradient fidelity of delayed methods: the accumulated gradient vs backprop at the same weights.

An observer of the engine's own workers, needing nothing above it: a run attaches it
(``fidelity_every``, ``run/trainer.py``) and the accounting samples it (``accounting/costs.py``).

At a tracked optimizer step of stage j, ``param.grad`` holds the gradient the method accumulated
over one group of k minibatches (the tracker observes the runner's ``before("step", ...)``, right
before ``optimizer.step()``, after the replica rule has combined the copies' gradients). The
reference is the true backprop gradient of stage j's weights for the *current* network — every
stage's weights as they are at that instant — on the same minibatches, with batch-norm in the
same training mode (batch statistics; running statistics left untouched). The runner takes the
steps due in a tick at its end, after every stage's forward and backward of the tick, stage by
stage in order, so "current" means: the stages before j that were due this tick have stepped,
the stages after j not yet.

Cost per tracked group: about one forward of the network plus one backward down to stage j, per
stage and minibatch; with ``every`` = a few hundred steps it is a few percent of training.

**Rebuilt inputs.** For the tracked groups' minibatches the tracker also measures how far the
input a stage computes its gradient at is from the one it received in the forward: ``input_error``,
‖x̂ − x‖ / ‖x‖ over both streams, the mean over the group. A stage that keeps its input or its
graph computes at the exact input (0). A stage that rebuilds its input inverts, with its current
weights, the value the next stage handed down — itself rebuilt, if that stage rebuilds too — so
its error is the drift a run of reversible stages compounds (``methods/registry.py``, bounded
rebuild chains). The tracker inverts the handed-down value itself, right before the stage's
rebuild (the weights it rebuilds with), with running statistics frozen.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..batchnorm import frozen_running_stats
from ..engine.observers import Observer
from ..models import streams
from ..replicas import DataParallel
from ..replicas.rule import flat_grads


def true_gradient(model, stage: int, batches) -> torch.Tensor:
    """Flat gradient of the mean loss (the model family's) over ``batches`` w.r.t. stage ``stage``'s parameters.

    Uses ``torch.autograd.grad`` (never touches ``.grad``) and frozen running statistics.
    """
    stages = list(model)
    params = list(stages[stage].parameters())
    total = None
    with frozen_running_stats(model):
        for x, y in batches:
            with torch.no_grad():
                h = x
                for s in stages[:stage]:
                    h = s(h)
            h = streams.apply(torch.Tensor.detach, h)
            for s in stages[stage:]:
                h = s(h)
            grads = torch.autograd.grad(model.family.loss(h, y) / len(batches), params, allow_unused=True)
            flat = torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params)])
            total = flat if total is None else total + flat
    return total


def compare(grad: torch.Tensor, true: torch.Tensor) -> dict:
    g, t = grad.double(), true.double()
    gn, tn = float(g.norm()), float(t.norm())
    cosine = float(g @ t) / (gn * tn) if gn > 0 and tn > 0 else float("nan")
    rel = float((g - t).norm()) / tn if tn > 0 else float("nan")
    return dict(cosine=cosine, rel_error=rel, grad_norm=gn, true_norm=tn)


class FidelityTracker(Observer):
    """Attached to a pipeline: every ``every``-th optimizer step of each stage, compare gradients.

    Records (tidy): method, step (optimizer step of the stage = accumulation group), tick, stage,
    kind, num_minibatches, cosine, rel_error, grad_norm, true_norm, input_error. Observation only: an
    :class:`~petra_core.engine.observers.Observer` in ``sim.observers``, it caches the tracked
    groups' minibatches as stage 0 fetches them (``fetched``) and reads ``.grad`` right before the
    step (``before("step", ...)``); a tracked minibatch fetched before it was attached (a resumed
    run) is fetched again with ``sim.get_batch``, and the rest of what a tracked group in flight needs
    travels in the checkpoint (:meth:`state_dict`). It tracks the stages of the pipeline's first
    replica (``sim.workers``); with several replicas under ``dp`` the stepped gradient is the mean
    over every replica's minibatches of the group, and so is the reference. ``tick`` is the tick at
    whose end the step is taken (a final partial group: the number of ticks, as it is stepped after
    the last one).
    """

    def __init__(self, sim, every: int = 200):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.sim, self.every = sim, every
        self.k = sim.workers[0].k
        self.records: list[dict] = []
        self._batches: dict[int, tuple] = {}  # stream minibatch id -> batch, of the tracked groups
        self._done: dict[int, set[int]] = {}
        self._workers = {id(w) for w in sim.workers}
        # the stages that rebuild their input (the only ones whose inputs the tracker keeps)
        self._rebuilders = {w.index for w in sim.workers if w.storage.needs_output_back and not w.storage.keeps}
        self._R = sim.world.placement.mesh.replicas
        # replicas whose minibatches make the gradient the first replica steps with
        self._sources = (
            range(self._R) if self._R > 1 and isinstance(sim.rule, DataParallel) else (sim.workers[0].replica,)
        )
        self._received: dict[tuple[int, int], Tensor] = {}  # (stage, mb) -> its forward input, tracked groups
        self._handed: dict[tuple[int, int], object] = {}  # (stage, mb) -> the value handed down to it
        self._input_errors: dict[tuple[int, int], list[float]] = {}  # (stage, group) -> rebuilt-input errors
        sim.observers.append(self)

    def _tracked(self, group: int) -> bool:
        return group % self.every == 0

    def _stream_ids(self, group: int, pending: int) -> list[int]:
        """Stream minibatch ids of the first ``pending`` minibatches of ``group``, of every source replica."""
        return [t * self._R + r for t in range(group * self.k, group * self.k + pending) for r in self._sources]

    def fetched(self, replica: int, mb: int, batch) -> None:
        if replica in self._sources and self._tracked(mb // self._R // self.k):
            self._batches[mb] = batch

    def sent(self, worker, direction: str, msg) -> None:
        """Keep a tracked minibatch's forward input of each stage, and the value handed down to it."""
        if id(worker) not in self._workers or not self._tracked(msg.mb // self.k):
            return
        receiver = worker.index + (1 if direction == "forward" else -1)
        if receiver not in self._rebuilders:  # a stage that keeps its input or graph: its error is 0
            return
        if direction == "forward":
            self._received[worker.index + 1, msg.mb] = streams.join(msg.activation).detach().double()
        elif getattr(msg, "activation", None) is not None:
            self._handed[worker.index - 1, msg.mb] = streams.apply(lambda t: t.detach().clone(), msg.activation)

    def _rebuilt_input_error(self, worker, mb: int) -> float:
        """0 for a stage that keeps its input or graph; the rebuild's error for one that inverts."""
        true = self._received.pop((worker.index, mb), None)
        handed = self._handed.pop((worker.index, mb), None)
        if not worker.storage.needs_output_back or worker.storage.keeps:
            return 0.0
        if true is None or handed is None or float(true.norm()) == 0:
            return float("nan")
        with torch.no_grad(), frozen_running_stats(worker.stage):
            got = streams.join(worker.stage.inverse(handed)).double()
        return float((got - true).norm() / true.norm())

    def before(self, phase: str, worker, mb: int | None) -> None:
        if id(worker) not in self._workers:
            return
        if phase == "rebuild" and self._tracked(mb // self.k):
            error = self._rebuilt_input_error(worker, mb)
            self._input_errors.setdefault((worker.index, mb // self.k), []).append(error)
        if phase != "step":
            return
        group = worker.steps
        if not self._tracked(group) or worker.pending == 0:
            return
        mbs = self._stream_ids(group, worker.pending)
        grad = flat_grads(worker.params)
        # a batch fetched before a resume is fetched again: get_batch is a pure function of mb
        batches = [self._batches[m] if m in self._batches else self.sim.get_batch(m) for m in mbs]
        true = true_gradient(self.sim.model, worker.index, batches)
        errors = self._input_errors.pop((worker.index, group), [])
        self.records.append(
            dict(
                method=self.sim.method.name,
                step=group,
                tick=self.sim.tick,
                stage=worker.index,
                kind=worker.stage.kind,
                num_minibatches=len(mbs),
                **compare(grad, true),
                input_error=sum(errors) / len(errors) if errors else float("nan"),
            )
        )
        done = self._done.setdefault(group, set())
        done.add(worker.index)
        if len(done) == len(self.sim.workers):  # every stage has used this group: free its batches
            for m in mbs:
                self._batches.pop(m, None)
            del self._done[group]
            own = range(group * self.k, (group + 1) * self.k)  # this replica's minibatches of the group
            for kept in (self._received, self._handed):  # what no rebuild of the group asked for
                for key in [key for key in kept if key[1] in own]:
                    del kept[key]

    def state_dict(self) -> dict:
        """What a resumed run needs to record exactly what an uninterrupted one would: the records so
        far and the tracked groups in flight (each stage's forward input, the value handed down to it,
        the rebuild errors measured, which stages have stepped the group). Their batches are not in
        it: ``get_batch`` fetches them again."""
        return {
            "records": [dict(r) for r in self.records],
            "received": dict(self._received),
            "handed": dict(self._handed),
            "input_errors": {key: list(errors) for key, errors in self._input_errors.items()},
            "done": {group: sorted(stages) for group, stages in self._done.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.records = [dict(r) for r in state["records"]]
        self._received, self._handed = dict(state["received"]), dict(state["handed"])
        self._input_errors = {key: list(errors) for key, errors in state["input_errors"].items()}
        self._done = {group: set(stages) for group, stages in state["done"].items()}

    def detach(self) -> None:
        if self in self.sim.observers:
            self.sim.observers.remove(self)

    def frame(self):
        import pandas as pd

        return pd.DataFrame(self.records)


def track_fidelity(sim, every: int = 200) -> FidelityTracker:
    """Attach gradient-fidelity tracking to ``sim`` (adds a :class:`FidelityTracker` to
    ``sim.observers``) every ``every`` optimizer steps; read ``.records``."""
    return FidelityTracker(sim, every=every)
