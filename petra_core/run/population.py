"""Evaluating a population of replicas (a run with ``replicas`` > 1), at the end of training.

What is reported (``metrics.json``, key ``population``):

* every model's top-1 (``members_top1``) and their mean;
* the ensemble's top-1: the mean of the models' softmax outputs;
* the weight average's top-1: the uniform mean of every parameter and batch-norm statistic,
  evaluated as it is (the averaged running statistics are *not* the statistics of the averaged
  model) and with its batch-norm statistics re-estimated on the run's ``bn_reestimate_batches``
  fixed training batches (:func:`~petra_core.run.evaluation.reestimate_batch_norm`);
* for a family without top-1 (a language model, :func:`family_population`): every model's test
  loss and their mean, and the weight average's test record as ``average_*``;
The model whose test record is the run's (``evaluated_model``, :func:`evaluated_record`): replica
0 (petra's default), the replicas' weight average (what the official CDP code evaluates after
training: the mean of every parameter and batch-norm statistic, as above, evaluated as it is), or
both (replica 0's as ``top1``, ``top5``, ``test_loss`` and the average's as ``average_top1``, ...).

The floats each replica put into collectives per optimizer step, counted by the replica groups
of the world (gradient all-reduces for ``dp``/``cdp``, PAPA's averages, WASH's gathers), are
``metrics.json``'s ``floats_sent_per_step`` for every run.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from .evaluation import evaluate, reestimate_batch_norm


def average_model(models):
    """A copy of ``models[0]`` holding the uniform mean of the models' floating-point state
    (parameters and batch-norm statistics; integer buffers are replica 0's)."""
    average = copy.deepcopy(models[0])
    states = [m.state_dict() for m in models]
    merged = {}
    for key, value in states[0].items():
        if value.is_floating_point():
            total = value.detach().clone()
            for s in states[1:]:
                total += s[key].to(total.device)
            merged[key] = total / len(states)
        else:
            merged[key] = value
    average.load_state_dict(merged)
    return average


@torch.no_grad()
def members_and_ensemble(models, stream) -> tuple[list[float], float]:
    """Each model's top-1 (%) and the top-1 of their mean softmax, in one pass over ``stream``."""
    for m in models:
        m.eval()
    correct, ensemble, n = [0.0] * len(models), 0.0, 0
    for images, labels in stream.iter_epoch(0):
        probs = None
        for i, m in enumerate(models):
            logits = m(images.to(next(m.parameters()).device)).float()
            labels_here = labels.to(logits.device)
            correct[i] += float((logits.argmax(1) == labels_here).sum())
            p = F.softmax(logits, dim=1)
            probs = p if probs is None else probs + p.to(probs.device)
        ensemble += float((probs.argmax(1) == labels.to(probs.device)).sum())
        n += len(labels)
    for m in models:
        m.train()
    return [100 * c / n for c in correct], 100 * ensemble / n


EVALUATED_MODELS = ("replica0", "average", "both")


def evaluated_record(choice: str, models, test_stream, replica0: dict) -> dict:
    """The metrics ``evaluated_model=choice`` adds to or changes in a run's summary, whose final
    test record (replica 0's) is ``replica0``: nothing for ``replica0``; the weight average's test
    record as ``average_*`` for ``both``; for ``average`` the average's as the run's own keys, and
    replica 0's kept as ``replica0_*``."""
    if choice not in EVALUATED_MODELS:
        raise ValueError(f"evaluated_model={choice!r} is not allowed; allowed: {', '.join(EVALUATED_MODELS)}")
    if choice == "replica0":
        return {}
    average = evaluate(average_model(models), test_stream)
    if choice == "both":
        return {f"average_{key}": value for key, value in average.items()}
    return {**{f"replica0_{key}": replica0.get(key) for key in average}, **average}


def evaluate_population(models, test_stream, train_stream, bn_batches: int) -> dict:
    """The ``population`` record of ``models`` (see the module docstring), floats not included."""
    if "top1" not in models[0].family.eval_names:
        return family_population(models, test_stream)
    members, ensemble = members_and_ensemble(models, test_stream)
    average = average_model(models)
    out = {
        "replicas": len(models),
        "members_top1": members,
        "members_top1_mean": sum(members) / len(members),
        "ensemble_top1": ensemble,
        "average_top1": evaluate(average, test_stream)["top1"],
    }
    if bn_batches:
        out["average_top1_bn_reestimated"] = evaluate(
            reestimate_batch_norm(average, train_stream, bn_batches), test_stream
        )["top1"]
        out["bn_reestimate_batches"] = min(bn_batches, train_stream.num_batches)
    return out


def family_population(models, test_stream) -> dict:
    """The ``population`` record of models whose family has no top-1 (a language model): every
    model's test loss and their mean, and the weight average's test record (its family's fields,
    ``average_*``); no ensemble, no batch-norm statistics."""
    members = [evaluate(m, test_stream)["test_loss"] for m in models]
    average = evaluate(average_model(models), test_stream)
    return {
        "replicas": len(models),
        "members_test_loss": members,
        "members_test_loss_mean": sum(members) / len(members),
        **{f"average_{key}": value for key, value in average.items()},
    }
