"""The recipe: Goyal scaling, warm-up then step decay, no weight decay on BN parameters and biases;
optimizers built from their declared options."""

import math

import pytest
import torch

from petra_core import Recipe, build_model
from petra_core.optim import make_optimizer


def test_goyal_scaling():
    assert Recipe(base_lr=0.1).lr(batch_size=64, k=2) == pytest.approx(0.05)  # CIFAR recipe
    assert Recipe(base_lr=0.1).lr(batch_size=64, k=4) == pytest.approx(0.1)  # ImageNet recipe
    assert Recipe(base_lr=0.3, scale_lr=False).lr(batch_size=64, k=4) == 0.3


def test_no_weight_decay_on_batchnorm_and_biases():
    stage = build_model("revnet18", num_classes=10, width=4)[-1]  # head: linear weight + bias
    opt, _ = make_optimizer(stage, Recipe(weight_decay=5e-4), batch_size=64, k=1, steps_per_epoch=10)
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    for name, p in stage.named_parameters():
        assert (id(p) in decayed) == (p.ndim > 1), name
    stem = build_model("revnet18", num_classes=10, width=4)[0]
    opt, _ = make_optimizer(stem, Recipe(weight_decay=5e-4), batch_size=64, k=1, steps_per_epoch=10)
    assert [len(g["params"]) for g in opt.param_groups] == [1, 2]  # conv weight | BN weight, BN bias
    assert opt.defaults["nesterov"] and opt.defaults["momentum"] == 0.9


@pytest.mark.parametrize("k", [1, 2])
def test_warmup_then_step_decay(k):
    """lr(step) = peak * min(1, (s+1)/W) * gamma^(milestones passed); one step = k minibatches."""
    batches_per_epoch, batch = 8, 64
    recipe = Recipe(base_lr=0.1, warmup_epochs=2, milestones=(3, 5), gamma=0.1)
    stage = torch.nn.Linear(2, 2)
    opt, sched = make_optimizer(stage, recipe, batch_size=batch, k=k, steps_per_epoch=batches_per_epoch / k)
    peak = 0.1 * batch * k / 256
    steps_per_epoch = batches_per_epoch // k
    warmup = 2 * steps_per_epoch
    seen = []
    for _ in range(7 * steps_per_epoch):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    for s, lr in enumerate(seen):
        factor = min(1.0, (s + 1) / warmup) if s < warmup else 1.0
        decays = sum(s >= m * steps_per_epoch for m in (3, 5))
        assert lr == pytest.approx(peak * factor * 0.1**decays, rel=1e-9), s


@pytest.mark.parametrize("k", [1, 2])
def test_warmup_then_cosine_down_to_the_final_ratio(k):
    """The closed form: peak·(s+1)/W in the warm-up, then peak·(r + (1 − r)(1 + cos(π p))/2), p the
    fraction of the steps from the warm-up's end to decay_epochs; flat at r·peak after it."""
    batches_per_epoch, peak, r = 8, 1e-3, 0.1
    recipe = Recipe(
        base_lr=peak,
        scale_lr=False,
        optimizer="adamw",
        warmup_epochs=1,
        decay="cosine",
        decay_epochs=5,
        final_lr_ratio=r,
    )
    opt, sched = make_optimizer(
        torch.nn.Linear(2, 2), recipe, batch_size=64, k=k, steps_per_epoch=batches_per_epoch / k
    )
    steps_per_epoch = batches_per_epoch // k
    warmup, end = steps_per_epoch, 5 * steps_per_epoch
    seen = []
    for _ in range(6 * steps_per_epoch):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    for s, lr in enumerate(seen):
        p = min(1.0, (s - warmup) / (end - warmup))
        want = (s + 1) / warmup if s < warmup else r + (1 - r) * (1 + math.cos(math.pi * p)) / 2
        assert lr == pytest.approx(peak * want, rel=1e-12), s
    assert seen[warmup] == pytest.approx(peak) and seen[end:] == pytest.approx([r * peak] * (len(seen) - end))


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"decay": "linear"}, "decay='linear' is not allowed; allowed: step, cosine"),
        (
            {"decay": "cosine", "decay_epochs": 5, "milestones": (3,)},
            "milestones=[3] with decay='cosine'; allowed: no milestones (the cosine decays every step)",
        ),
        (
            {"decay": "cosine", "decay_epochs": 1, "warmup_epochs": 1},
            "decay_epochs=1 is not allowed with decay='cosine'; allowed: more than warmup_epochs (1), the run's epochs",
        ),
        ({"final_lr_ratio": 1.5}, "final_lr_ratio=1.5 is not allowed; allowed: a number in [0, 1]"),
    ],
)
def test_a_bad_cosine_recipe_is_one_line(bad, message):
    with pytest.raises(ValueError) as err:
        Recipe(**bad)
    assert str(err.value) == message


def test_the_run_config_carries_the_cosine_into_the_recipe():
    from petra_core.run.config import ConfigError, RunConfig
    from petra_core.run.trainer import recipe_of

    cfg = RunConfig.from_dict({"epochs": 20, "warmup_epochs": 2.5, "lr_decay": "cosine", "final_lr_ratio": 0.1})
    recipe = recipe_of(cfg)
    assert (recipe.decay, recipe.decay_epochs, recipe.final_lr_ratio) == ("cosine", 20, 0.1)
    with pytest.raises(ConfigError, match=r"^milestones=\[10\] with lr_decay=cosine; use milestones=\[\]"):
        RunConfig.from_dict({"epochs": 20, "lr_decay": "cosine", "milestones": [10]})
    with pytest.raises(ConfigError, match=r"^final_lr_ratio=2.0 must be in \[0, 1\]"):
        RunConfig.from_dict({"final_lr_ratio": 2})
    with pytest.raises(ConfigError, match=r"^lr_decay='exp' is not allowed"):
        RunConfig.from_dict({"lr_decay": "exp"})


def test_an_optimizer_is_built_from_its_declared_options_only():
    from petra_core.optim import OPTIMIZERS, kind_of

    params = [{"params": [torch.nn.Parameter(torch.zeros(2))]}]
    with pytest.raises(ValueError) as err:
        OPTIMIZERS["sgd"].build(params, lr=0.1, betas=(0.9, 0.999))
    assert str(err.value) == "optimizer 'sgd' has no option 'betas'; allowed: lr, momentum, nesterov"
    assert kind_of(OPTIMIZERS["adamw"].build(params, lr=0.1)) is OPTIMIZERS["adamw"]
    with pytest.raises(ValueError, match="optimizer Adam is not declared; allowed: SGD, AdamW"):
        kind_of(torch.optim.Adam(params, lr=0.1))  # a ZeRO-1 shard could not rebuild it alike


def test_decay_1d_decays_every_parameter_as_the_official_codes_do():
    stem = build_model("revnet18", num_classes=10, width=4)[0]  # conv weight, BN weight, BN bias
    opt, _ = make_optimizer(stem, Recipe(weight_decay=5e-4, decay_1d=True), batch_size=64, k=1, steps_per_epoch=10)
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] == 5e-4 for p in g["params"]}
    assert decayed == {id(p) for p in stem.parameters()} and len(decayed) == 3
    assert [g["weight_decay"] for g in opt.param_groups] == [5e-4]


def test_adamw_betas_and_eps_reach_torch():
    stage = torch.nn.Linear(2, 2)
    opt, _ = make_optimizer(stage, Recipe(optimizer="adamw"), batch_size=64, k=1, steps_per_epoch=10)
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["betas"] == (0.9, 0.999) and opt.defaults["eps"] == 1e-8
    recipe = Recipe(optimizer="adamw", betas=(0.9, 0.95), eps=1e-6)
    opt, _ = make_optimizer(stage, recipe, batch_size=64, k=1, steps_per_epoch=10)
    assert opt.defaults["betas"] == (0.9, 0.95) and opt.defaults["eps"] == 1e-6
    assert all(g["betas"] == (0.9, 0.95) and g["eps"] == 1e-6 for g in opt.param_groups)


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(betas=(0.9, 1.0)), "betas=(0.9, 1.0) is not allowed; allowed: two numbers in [0, 1)"),
        (dict(betas=(0.9,)), "betas=(0.9,) is not allowed; allowed: two numbers in [0, 1)"),
        (dict(eps=0.0), "eps=0.0 is not allowed; allowed: a number > 0"),
    ],
)
def test_bad_betas_or_eps_are_one_line(bad, message):
    with pytest.raises(ValueError) as err:
        Recipe(optimizer="adamw", **bad)
    assert str(err.value) == message


def test_the_run_config_carries_the_conventions_into_the_recipe():
    from petra_core.run.config import ConfigError, RunConfig
    from petra_core.run.trainer import recipe_of

    assert recipe_of(RunConfig()) == Recipe(base_lr=0.1, weight_decay=5e-4)  # the defaults: today's recipe
    cfg = RunConfig.from_dict({"optimizer": "adamw", "adam_betas": [0.9, 0.95], "adam_eps": 1e-6, "decay_1d": True})
    recipe = recipe_of(cfg)
    assert (recipe.betas, recipe.eps, recipe.decay_1d) == ((0.9, 0.95), 1e-6, True)
    with pytest.raises(ConfigError, match=r"^adam_betas=\[0.9\] must be two numbers in \[0, 1\)"):
        RunConfig.from_dict({"adam_betas": [0.9]})
    with pytest.raises(ConfigError, match=r"^adam_eps=0.0 must be > 0$"):
        RunConfig.from_dict({"adam_eps": 0})


def test_the_call_clock_ramps_one_learning_rate_over_calls_then_decays_per_step():
    """``warmup_clock="call"``: lr at step s = peak · min(1, (c(s) + 1)/W) · gamma^(milestones ≤ s),
    W in calls (minibatches), c(s) the call the stage steps in."""
    from petra_core.optim import CallWarmup

    recipe = Recipe(base_lr=0.1, scale_lr=False, warmup_epochs=2, milestones=(3,), gamma=0.1, warmup_clock="call")
    stage = torch.nn.Linear(2, 2)

    def call_of_step(s):  # k = 2, a stage stepping 5 calls after its step's first minibatch
        return 2 * s + 5

    opt, sched = make_optimizer(stage, recipe, batch_size=64, k=2, steps_per_epoch=4, call_of_step=call_of_step)
    assert isinstance(sched, CallWarmup)
    warmup_calls = 2 * 4 * 2  # 2 epochs of 8 minibatches
    seen = []
    for _ in range(20):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    for s, lr in enumerate(seen):
        expected = 0.1 * min(1.0, (2 * s + 5 + 1) / warmup_calls) * 0.1 ** (s >= 12)
        assert lr == pytest.approx(expected, rel=1e-12), s
    resumed_opt, resumed = make_optimizer(
        stage, recipe, batch_size=64, k=2, steps_per_epoch=4, call_of_step=call_of_step
    )
    resumed.load_state_dict(sched.state_dict())
    assert resumed_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    with pytest.raises(ValueError) as err:
        Recipe(warmup_clock="tick")
    assert str(err.value) == "warmup_clock='tick' is not allowed; allowed: step, call"


@pytest.mark.parametrize("method, k", [("petra", 1), ("backprop", 2)])
def test_with_the_call_clock_every_stage_steps_at_the_lr_of_the_call_it_steps_in(method, k):
    """In a run, stage j's step s takes the call of the tick its schedule steps it at: the last
    minibatch to have entered stage 0 by the backward of the step's last minibatch."""
    from conftest import BeforeStep, make_batches, make_model

    from petra_core import Simulator
    from petra_core.engine.spec import schedule_for
    from petra_core.methods import METHODS

    n, B = 12, 4  # minibatches, per epoch
    recipe = Recipe(base_lr=0.1, scale_lr=False, weight_decay=0.0, warmup_epochs=2, warmup_clock="call")
    data = make_batches(n)
    sim = Simulator(
        make_model(method=method), method, num_batches=n, batches_per_epoch=B, get_batch=data.__getitem__,
        batch_size=6, k=k, recipe=recipe,
    )  # fmt: skip
    seen = {}
    sim.observers.append(BeforeStep(lambda w: seen.setdefault((w.index, w.steps), w.optimizer.param_groups[0]["lr"])))
    sim.run()
    schedule = schedule_for(METHODS[method], len(sim.model), n, k)
    ticks_to_calls = [max(m for m in range(n) if schedule.forward_tick(m, 0) <= t) for t in range(schedule.num_ticks)]
    assert len(seen) == len(sim.model) * (n // k)
    for (j, s), lr in seen.items():
        call = ticks_to_calls[schedule.backward_tick((s + 1) * k - 1, j)]
        assert lr == pytest.approx(0.1 * min(1.0, (call + 1) / (2 * B)), rel=1e-12), (j, s)
    if method == "petra":  # pipelined: the call is the tick, capped at the last minibatch
        J = len(sim.model)
        assert all(
            seen[j, s] == pytest.approx(0.1 * min(1.0, (min(s + 2 * (J - 1) - j, n - 1) + 1) / 8)) for j, s in seen
        )
