"""Evaluating a staged model: its family's test metrics, and the batch-norm re-estimation diagnostic.

The paper's metric is top-1 with the running statistics as trained. Delayed methods update
those statistics from weights that move while a minibatch is in flight, so at short budgets the
statistics can lag the weights. :func:`reestimate_batch_norm` recomputes them (a plain average
over a fixed set of training batches, weights untouched, on a copy) so that a run can report both
numbers: the gap between them is what the statistics, not the weights, cost.
"""

from __future__ import annotations

import copy

import torch
from torch.nn.modules.batchnorm import _BatchNorm


@torch.no_grad()
def evaluate(model, stream) -> dict:
    """The model family's test metrics (image classification: test loss, top-1 and top-5 in %)
    with running batch-norm statistics: its per-batch sums added up over the test set."""
    was_training = model.training
    model.eval()
    first = next(model.parameters()).device
    last = next(model[-1].parameters()).device
    sums: dict[str, float] = {}
    n = 0.0
    for inputs, targets in stream.iter_epoch(0):
        output = model(inputs.to(first))
        for key, value in model.family.eval_sums(output, targets.to(last)).items():
            sums[key] = sums.get(key, 0.0) + value
        n += len(targets)
    model.train(was_training)
    return model.family.eval_record(sums, n)


def has_batch_norm(model) -> bool:
    """Does ``model`` hold batch-norm layers (running statistics that :func:`reestimate_batch_norm` redoes)?"""
    return any(isinstance(m, _BatchNorm) for m in model.modules())


@torch.no_grad()
def reestimate_batch_norm(model, train_stream, num_batches: int):
    """A copy of ``model`` whose batch-norm running statistics are the plain average over the
    first ``num_batches`` training batches of epoch 0 (a fixed set: a pure function of the seed)."""
    model = copy.deepcopy(model)
    norms = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average: every batch weighs the same
    model.train()
    first = next(model.parameters()).device
    for index in range(min(num_batches, train_stream.num_batches)):
        images, _ = train_stream.batch(0, index)
        model(images.to(first))
    return model
