"""The plain-PyTorch delayed-gradient reference (methods/delayed_reference.py) against the engine:
with the pipeline's delays it is the ``delayed`` method's training (measured: the same bits) on a
tiny revgpt, its twin and a tiny RevViT in float64; zero delays are backprop; bad delays are refused in one line."""

import copy

import pytest
import torch
from test_transformer_families import batches, tiny

from petra_core import Recipe, simulate
from petra_core.methods.delayed_reference import train_delayed
from petra_core.methods.schedule import staleness

ADAMW = Recipe(
    base_lr=0.01, optimizer="adamw", weight_decay=0.1, scale_lr=False, warmup_epochs=0.25, milestones=(0.75,)
)


@pytest.mark.parametrize("arch", ["revgpt", "gpt", "revvit"])
def test_pipeline_delays_reproduce_the_engines_delayed_method(arch):
    """Same seed, same minibatches, AdamW with warm-up and a milestone (weights move): the
    reference's weights and losses equal the engine's ``delayed`` run's within 1e-10."""
    n = 12
    data = batches(arch, n)
    engine = tiny(arch, depth=3)
    reference = copy.deepcopy(engine)
    log = simulate(engine, "delayed", data, recipe=ADAMW).head_log
    J = len(reference)
    losses = train_delayed(
        reference, data.__getitem__, n, [staleness(J, j) for j in range(J)], ADAMW, batch_size=len(data[0][1])
    )
    assert losses == pytest.approx([r.loss for r in log], rel=1e-10)
    for (name, p), q in zip(engine.named_parameters(), reference.parameters()):
        assert torch.allclose(p, q, rtol=1e-10, atol=1e-12), name


def test_zero_delays_are_backprop_and_other_delays_differ():
    """Delays of 0 are backprop (the engine's backprop run, 1e-10); delaying one stage changes the
    weights (the delay is applied, not ignored)."""
    n = 8
    data = batches("revgpt", n)
    engine = tiny("revgpt")
    reference, delayed = copy.deepcopy(engine), copy.deepcopy(engine)
    simulate(engine, "backprop", data, recipe=ADAMW)
    J = len(reference)
    train_delayed(reference, data.__getitem__, n, [0] * J, ADAMW, batch_size=len(data[0][1]))
    train_delayed(delayed, data.__getitem__, n, [0] * (J - 2) + [1, 0], ADAMW, batch_size=len(data[0][1]))
    for p, q in zip(engine.parameters(), reference.parameters()):
        assert torch.allclose(p, q, rtol=1e-10, atol=1e-12)
    assert not all(torch.equal(q, r) for q, r in zip(reference.parameters(), delayed.parameters()))


def test_weight_prediction_moves_the_forward_and_restores_the_weights():
    """predict > 0 changes the training, and predict = 0 is the plain reference bit for bit."""
    n = 6
    data = batches("revgpt", n)
    a = tiny("revgpt")
    b, c = copy.deepcopy(a), copy.deepcopy(a)
    delays = [2 * (len(a) - 1 - j) for j in range(len(a))]
    plain = train_delayed(a, data.__getitem__, n, delays, ADAMW, batch_size=len(data[0][1]))
    again = train_delayed(b, data.__getitem__, n, delays, ADAMW, batch_size=len(data[0][1]), predict=0.0)
    predicted = train_delayed(c, data.__getitem__, n, delays, ADAMW, batch_size=len(data[0][1]), predict=1.0)
    assert plain == again
    assert predicted != plain


@pytest.mark.parametrize("delays", [[0, 0], [1, 2, 3, -1, 0], [0, 0, 0, 1.5, 0]])
def test_bad_delays_are_refused_in_one_line(delays):
    model = tiny("revgpt")
    delays = delays if len(delays) != 2 else [0] * (len(model) + 1)
    with pytest.raises(ValueError, match=r"delays=.*expected \d+ non-negative integers") as err:
        train_delayed(model, lambda m: None, 1, delays, ADAMW, batch_size=1)
    assert "\n" not in str(err.value)


def test_optimizers_for_steps_every_optimizer_of_a_stage_on_the_recipes_schedule():
    """A stage may be stepped by several optimizers (the benchmark's Muon on the blocks' matrices,
    AdamW on the rest): each moves only its own parameters, each on the recipe's schedule
    (``make_schedule`` gives a separately built optimizer the lrs ``make_optimizer`` gives its own)."""
    from petra_core.optim import make_optimizer, make_schedule

    n = 6
    data = batches("revgpt", n)
    model = tiny("revgpt")
    plain = copy.deepcopy(model)
    seen = {}

    def optimizers_for(j, stage, steps_per_epoch):
        named = list(stage.named_parameters())
        matrices = [p for _, p in named if p.ndim == 2]
        rest = [(name, p) for name, p in named if p.ndim != 2]
        first = make_optimizer(stage, ADAMW, batch_size=3, k=1, steps_per_epoch=steps_per_epoch, params=rest)
        sgd = torch.optim.SGD(matrices, lr=ADAMW.base_lr)
        seen[j] = (first, (sgd, make_schedule(sgd, ADAMW, k=1, steps_per_epoch=steps_per_epoch)))
        return list(seen[j])

    J = len(model)
    train_delayed(model, data.__getitem__, n, [0] * J, ADAMW, batch_size=3, optimizers_for=optimizers_for)
    train_delayed(plain, data.__getitem__, n, [0] * J, ADAMW, batch_size=3)
    for (opt, _), (sgd, _) in seen.values():
        assert {id(p) for g in opt.param_groups for p in g["params"]}.isdisjoint(
            id(p) for p in sgd.param_groups[0]["params"]
        )
        assert [g["lr"] for g in opt.param_groups][0] == sgd.param_groups[0]["lr"]  # the same point of the schedule
    moved = [not torch.equal(p, q) for p, q in zip(model.parameters(), plain.parameters())]
    assert any(moved)  # SGD on the matrices is not AdamW's training


def test_delaying_some_of_a_stages_parameters():
    """``delayed`` picks which parameters wait their stage's delay: all of them is the stage-wise
    reference bit for bit, none of them is no delay bit for bit, and the attention branch alone is
    neither (the other parameters step on time, from the first minibatch)."""
    n = 8
    data = batches("revgpt", n)
    base = tiny("revgpt", depth=3)
    J = len(base)
    delays = [2 * (J - 1 - j) for j in range(J)]

    def train(delays, **options):
        model = copy.deepcopy(base)
        losses = train_delayed(model, data.__getitem__, n, delays, ADAMW, batch_size=3, **options)
        return losses, [p.detach().clone() for p in model.parameters()]

    def same(a, b):
        return a[0] == b[0] and all(torch.equal(p, q) for p, q in zip(a[1], b[1]))

    stagewise, none = train(delays), train([0] * J)
    assert same(train(delays, delayed=lambda name: True), stagewise)
    assert same(train(delays, delayed=lambda name: False), none)
    attention = train(delays, delayed=lambda name: ".F." in f".{name}")
    assert not same(attention, stagewise) and not same(attention, none)
