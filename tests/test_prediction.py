"""Weight prediction (methods/prediction.py) in the engine.

The oracles: the ``delayed`` method with prediction α is the plain-PyTorch delayed reference with
``predict=α`` (float64, 1e-10); the predictor's shift is w + α·τ·Δw and gives back the same bits;
a predicted PETRA run resumed at any tick, and one on static phases, give the bits of an
uninterrupted eager one; α = 0 is the method itself. Bad values are refused in one line.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import make_batches, make_model, resumed
from test_delayed_reference import ADAMW
from test_transformer_families import batches, tiny

from petra_core import Pipeline, Recipe, simulate
from petra_core.engine import LocalWorld, PipelineSpec
from petra_core.methods import METHODS
from petra_core.methods.delayed_reference import train_delayed
from petra_core.methods.prediction import WeightPredictor
from petra_core.methods.schedule import staleness
from petra_core.run.config import ConfigError, RunConfig

LR = Recipe(base_lr=0.05, weight_decay=5e-4, scale_lr=False, warmup_epochs=1.0, milestones=(1.5,))


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_the_delayed_method_with_prediction_is_the_reference_with_predict(alpha):
    """Forward and backward on a stash of w + α·τ·Δw, the gradient applied at w: the reference's
    losses and weights within 1e-10 (float64, AdamW with warm-up and a milestone)."""
    n = 12
    data = batches("revgpt", n)
    engine = tiny("revgpt", depth=3)
    reference = copy.deepcopy(engine)
    log = simulate(engine, METHODS["delayed"].predicting(alpha), data, recipe=ADAMW).head_log
    J = len(reference)
    delays = [staleness(J, j) for j in range(J)]
    losses = train_delayed(reference, data.__getitem__, n, delays, ADAMW, batch_size=len(data[0][1]), predict=alpha)
    assert losses == pytest.approx([r.loss for r in log], rel=1e-10)
    for (name, p), q in zip(engine.named_parameters(), reference.parameters()):
        assert torch.allclose(p, q, rtol=1e-10, atol=1e-12), name
    plain = copy.deepcopy(tiny("revgpt", depth=3))
    simulate(plain, "delayed", data, recipe=ADAMW)
    assert not all(torch.equal(p, q) for p, q in zip(plain.parameters(), engine.parameters()))  # it predicted


def test_the_predictor_shifts_to_w_plus_its_scaled_last_update_and_restores_the_same_bits():
    torch.manual_seed(0)
    w = [torch.randn(5, 3, requires_grad=True), torch.randn(7, requires_grad=True)]
    predictor = WeightPredictor(w, alpha=0.5, lag=4)
    before = [p.detach().clone() for p in w]
    predictor.before_step()
    with torch.no_grad():  # an "optimizer step"
        for p in w:
            p.add_(torch.randn_like(p))
    predictor.after_step()
    after = [p.detach().clone() for p in w]
    assert all(torch.equal(d, a - b) for d, a, b in zip(predictor.delta, after, before))
    with predictor.shifted():
        for p, a, d in zip(w, after, predictor.delta):
            assert torch.equal(p, a + 2.0 * d)
    assert all(torch.equal(p, a) for p, a in zip(w, after))
    assert predictor.nbytes() == 2 * 4 * (15 + 7)


def _pipeline(model, data, method, *, phases="eager", k=1):
    return Pipeline.build(
        PipelineSpec(
            model=model,
            method=method,
            world=LocalWorld(),
            num_batches=len(data),
            get_batch=data.__getitem__,
            batch_size=len(data[0][1]),
            batches_per_epoch=4,
            k=k,
            recipe=LR,
            phases=phases,
        )
    )


def _train(method, *, n=9, k=1, phases="eager", interrupt_at=None):
    model, data = make_model(), make_batches(n)

    def pipeline(model):
        return _pipeline(model, data, method, phases=phases, k=k)

    pipe = pipeline(model)
    if interrupt_at is not None:
        model, pipe = resumed(pipe, model, interrupt_at, lambda: make_model(seed=1), pipeline)
    pipe.run()
    return model.state_dict(), [r.loss for r in pipe.head_log], pipe


def _same_bits(a, b) -> bool:
    return a[1] == b[1] and all(torch.equal(a[0][name], b[0][name]) for name in a[0])


@pytest.mark.parametrize("method", ["petra", "dsp"])
def test_prediction_changes_the_training_and_zero_is_the_method_itself(method):
    assert METHODS[method].predicting(0) is METHODS[method]
    predicted = _train(METHODS[method].predicting(1.0))
    assert not _same_bits(predicted, _train(method))
    workers = predicted[2].workers
    params = [sum(p.numel() * p.element_size() for p in w.params) for w in workers]
    kept = [w.peak_kept.get("weight_prediction", 0) for w in workers]
    assert kept == [2 * b for b in params[:-1]] + [0]  # Δw and the restore buffer; the head is on time


@pytest.mark.parametrize("interrupt_at", [4, 9, 14])
def test_a_predicted_petra_run_resumed_at_any_tick_gives_the_same_bits(interrupt_at):
    """The last update Δw is in the checkpoint: without it the first forwards after a resume would
    run at w, not at w + τΔw."""
    method = METHODS["petra"].predicting(1.0)
    assert _same_bits(_train(method, k=2, interrupt_at=interrupt_at), _train(method, k=2))


def test_a_predicted_petra_run_on_static_phases_gives_the_bits_of_an_eager_one():
    method = METHODS["petra"].predicting(1.0)
    assert _same_bits(_train(method, k=2, phases="static"), _train(method, k=2))


def test_a_checkpoint_without_the_last_update_is_refused_in_one_line():
    data = make_batches(6)
    plain = _pipeline(make_model(), data, "petra")
    plain.run(ticks=5)
    predicted = _pipeline(make_model(), data, METHODS["petra"].predicting(1.0))
    with pytest.raises(ValueError, match="saved without weight prediction") as err:
        predicted.load_state_dict(plain.state_dict())
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "method,alpha,needle",
    [
        ("backprop", 1.0, "method 'backprop' delays none (allowed with: delayed, dsp, petra"),
        ("gpipe", 0.5, "method 'gpipe' delays none"),
        ("petra", -1.0, "must be a finite number >= 0"),
        ("petra", float("inf"), "must be a finite number >= 0"),
    ],
)
def test_bad_weight_predictions_are_refused_in_one_line(method, alpha, needle):
    with pytest.raises(ValueError) as err:
        METHODS[method].predicting(alpha)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_run_config_key_reaches_the_method_and_is_checked():
    from petra_core.run.trainer import session_plan

    plan = session_plan(RunConfig(method="petra", weight_prediction=1.0, width=4))
    assert plan.method.weight_prediction == 1.0
    with pytest.raises(ConfigError, match="weight_prediction=1 predicts"):
        RunConfig(method="backprop", weight_prediction=1.0).validate()
