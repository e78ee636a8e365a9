"""benchmarks/delay_sensitivity.py's settings: each builds the recipe and optimizers it names (the
benchmark's runs take minutes; these check what they would train with, in a blink)."""

import importlib.util
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "delay_sensitivity.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("delay_sensitivity", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_setting_names_a_known_baseline_with_its_model_and_a_delay_per_stage(bench):
    stages = {"revgpt": 6, "gpt": 6, "revvit": 8, "vit": 8}
    twins = {"gpt": "revgpt", "vit": "revvit"}  # a twin's no-delay row is costed against the reversible's
    for name, (arch, delays, question, options, baseline) in bench.SETTINGS.items():
        assert len(delays) == stages[arch], name
        reversible = twins.get(arch, arch)
        assert baseline == "" or bench.SETTINGS[baseline][0] in (arch, reversible), name
        assert question and isinstance(options, dict), name


def test_the_revvit_recipes_follow_the_named_budget_schedule_and_optimizer(bench):
    step = bench.recipe({"lr": 1e-4, "epochs": 16}, "revvit")
    assert (step.base_lr, step.optimizer, step.warmup_epochs, step.milestones) == (1e-4, "adamw", 2.0, (10.0, 14.0))
    assert step.betas == (0.9, 0.999)
    assert bench.recipe(bench.SETTINGS["vit-beta2-0.95"][3], "revvit").betas == (0.9, 0.95)
    assert bench.recipe({}, "revgpt").betas == (0.9, 0.99)  # nanoGPT's
    default = bench.recipe({}, "revvit")  # the profile's 1,000 minibatches
    assert (default.warmup_epochs, default.milestones) == (0.5, (2.5, 3.5))
    cosine = bench.recipe({"cosine": True, "epochs": 1}, "revvit")  # minREV's: down to 0
    assert (cosine.decay, cosine.decay_epochs, cosine.final_lr_ratio, cosine.milestones) == ("cosine", 1, 0.0, ())
    sgd = bench.recipe(bench.SETTINGS["vit-sgd"][3], "revvit")
    assert (sgd.optimizer, sgd.base_lr, sgd.momentum, sgd.nesterov, sgd.weight_decay) == ("sgd", 0.1, 0.9, True, 5e-4)
    assert bench.epochs("revvit", {"epochs": 16}) == 16 and bench.epochs("revvit", {}) == bench.VIT_EPOCHS


def test_a_delay_scaled_lr_divides_each_stage_by_its_delay_to_the_power(bench):
    recipe = bench.recipe({}, "revvit")
    stages = [torch.nn.Linear(2, 2) for _ in range(3)]
    delays = (4, 2, 0)
    for power, expected in ((1.0, (0.25, 0.5, 1.0)), (0.5, (0.5, 2**-0.5, 1.0))):
        build = bench.delay_scaled(recipe, 64, delays, power)
        for j, stage in enumerate(stages):
            ((opt, _),) = build(j, stage, 10)
            assert opt.param_groups[0]["initial_lr"] == pytest.approx(recipe.base_lr * expected[j])


def test_a_row_records_the_per_stage_lr_power_it_trained_with(bench, monkeypatch):
    """The row of a ``delay_lr`` setting says which power of the delay divided each stage's lr (the
    report names it in the row's recipe); training and evaluation are stood in for."""
    from types import SimpleNamespace

    stream = SimpleNamespace(num_batches=2, batch=lambda epoch, i: (None, None))
    monkeypatch.setattr(bench, "data_and_model", lambda *a: (stream, stream, torch.nn.Linear(1, 1), 64))
    seen = {}

    def fake_training(model, get_batch, num_batches, delays, recipe, **kwargs):
        seen["optimizers_for"] = kwargs["optimizers_for"]
        return [1.0] * num_batches

    monkeypatch.setattr(bench, "train_delayed", fake_training)
    monkeypatch.setattr(bench, "evaluate", lambda model, test: {"top1": 30.0})
    scaled = bench.run("vit-delay-lr-sqrt", "", "")
    assert scaled["delay_lr"] == 0.5 and seen["optimizers_for"] is not None
    plain = bench.run("vit-lr-1e-4", "", "")
    assert plain["delay_lr"] == 0.0 and seen["optimizers_for"] is None
    assert (plain["beta2"], bench.run("vit-beta2-0.95", "", "")["beta2"]) == (0.999, 0.95)
    assert plain["minibatches"] == 2 * bench.VIT_EPOCHS and plain["lr"] == 1e-4
