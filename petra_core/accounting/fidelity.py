"""Gradient fidelity of delayed methods: the accumulated gradient vs backprop at the same weights.

At a tracked optimizer step of stage j, ``param.grad`` holds the gradient the method accumulated
over one group of k minibatches (a step hook runs right before ``optimizer.step()``). The
reference is the true backprop gradient of stage j's weights for the *current* network — every
stage's weights as they are at that instant — on the same minibatches, with batch-norm in the
same training mode (batch statistics; running statistics left untouched). Stages step at
different ticks, so "current" means: stages before j have finished the tick, stages after j not
yet (the simulator runs stages in order within a tick).

Cost per tracked group: about one forward of the network plus one backward down to stage j, per
stage and minibatch; with ``every`` = a few hundred steps it is a few percent of training.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..batchnorm import frozen_running_stats


def true_gradient(model, stage: int, batches) -> torch.Tensor:
    """Flat gradient of the mean cross-entropy over ``batches`` w.r.t. stage ``stage``'s parameters.

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
            h = h.detach()
            for s in stages[stage:]:
                h = s(h)
            grads = torch.autograd.grad(F.cross_entropy(h, y) / len(batches), params, allow_unused=True)
            flat = torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params)])
            total = flat if total is None else total + flat
    return total


def compare(grad: torch.Tensor, true: torch.Tensor) -> dict:
    g, t = grad.double(), true.double()
    gn, tn = float(g.norm()), float(t.norm())
    cosine = float(g @ t) / (gn * tn) if gn > 0 and tn > 0 else float("nan")
    rel = float((g - t).norm()) / tn if tn > 0 else float("nan")
    return dict(cosine=cosine, rel_error=rel, grad_norm=gn, true_norm=tn)


class FidelityTracker:
    """Attached to a simulator: every ``every``-th optimizer step of each stage, compare gradients.

    Records (tidy): method, step (optimizer step of the stage = accumulation group), tick, stage,
    kind, num_minibatches, cosine, rel_error, grad_norm, true_norm. Observation only: it caches the
    tracked groups' minibatches as the simulator fetches them and reads ``.grad`` in a step hook;
    a tracked minibatch fetched before it was attached (a resumed run) is fetched again.
    """

    def __init__(self, sim, every: int = 200):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.sim, self.every = sim, every
        self.k = sim.workers[0].k
        self.records: list[dict] = []
        self._batches: dict[int, tuple] = {}
        self._done: dict[int, set[int]] = {}
        self._get_batch = sim.get_batch
        sim.get_batch = self._fetch
        for w in sim.workers:
            w.step_hooks.append(self._hook)

    def _tracked(self, group: int) -> bool:
        return group % self.every == 0

    def _fetch(self, mb: int):
        batch = self._get_batch(mb)
        if self._tracked(mb // self.k):
            self._batches[mb] = batch
        return batch

    def _hook(self, worker) -> None:
        group = worker.steps
        if not self._tracked(group):
            return
        mbs = range(group * self.k, group * self.k + worker.pending)
        grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                          for p in worker.stage.parameters()])
        # a batch fetched before a resume is fetched again: get_batch is a pure function of mb
        batches = [self._batches[mb] if mb in self._batches else self._get_batch(mb) for mb in mbs]
        true = true_gradient(self.sim.model, worker.index, batches)
        self.records.append(dict(method=self.sim.method.name, step=group, tick=self.sim.tick, stage=worker.index,
                                 kind=worker.stage.kind, num_minibatches=len(mbs), **compare(grad, true)))
        done = self._done.setdefault(group, set())
        done.add(worker.index)
        if len(done) == len(self.sim.workers):  # every stage has used this group: free its batches
            for mb in mbs:
                self._batches.pop(mb, None)
            del self._done[group]

    def detach(self) -> None:
        self.sim.get_batch = self._get_batch
        for w in self.sim.workers:
            if self._hook in w.step_hooks:
                w.step_hooks.remove(self._hook)

    def frame(self):
        import pandas as pd

        return pd.DataFrame(self.records)


def track_fidelity(sim, every: int = 200) -> FidelityTracker:
    """Attach gradient-fidelity tracking to ``sim`` every ``every`` optimizer steps; read ``.records``."""
    return FidelityTracker(sim, every=every)
