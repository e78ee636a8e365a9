"""Cyclic Data Parallelism's rules (petra_core/replicas/cdp.py) against their closed forms.

* cdp1 = DP with every mean gradient applied one step late (the first step skipped), float64,
  ≤ 1e-10, against a plain loop over one model and per-stage optimizers;
* with lr = 0, DP, CDP1 and CDP2 apply the same mean gradients, shifted as the rules say, checked
  cell by cell for N = 4 replicas of a 10-stage model (cdp2: stage l of replica r is one step
  late iff l < L − 1 − r);
* cdp2 on 2 gloo ranks (2 × 1) and cdp2 × PETRA on 2 × 2 (L = 4 groups) equal the simulator bit for bit;
* a `petra train` run with cdp2 resumes bit for bit (the rule's remembered gradients are in the
  checkpoint).
"""

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import SMALL, BeforeStep, argv, make_batches, make_model, rank_argv, tiny_run, untimed, whole_and_resumed
from harness.compare import assert_bit_for_bit, check_outcome, simulator_state
from harness.ranks import RANKS

from petra_core import Recipe, Simulator
from petra_core.engine.launch import launch_local
from petra_core.optim import make_optimizer
from petra_core.replicas import CDP2, get_rule
from petra_core.run.config import ConfigError, RunConfig

RECIPE = Recipe(base_lr=0.05, weight_decay=5e-4)


def weights(m):
    return {k: v for k, v in m.state_dict().items() if "running" not in k and "num_batches" not in k}


@pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")  # the closed form skips step 0 by hand
@pytest.mark.parametrize("R", [2, 3])
def test_cdp1_is_dp_with_every_gradient_one_step_late(R):
    steps, b = 4, 4
    data = make_batches(steps * R, torch.float64, batch=b)
    sim = Simulator(
        make_model(dtype=torch.float64),
        "backprop",
        num_batches=steps,
        get_batch=data.__getitem__,
        batch_size=b,
        recipe=RECIPE,
        replicas=R,
        rule="cdp1",
    ).run()

    model = make_model(dtype=torch.float64)  # the closed form: one model, the mean gradient applied late
    opts = [make_optimizer(stage, RECIPE, batch_size=b * R, k=1, steps_per_epoch=steps) for stage in model]
    previous = None
    for t in range(steps):
        for r in range(R):
            x, y = data[t * R + r]
            (F.cross_entropy(model(x), y) / R).backward()
        current = [p.grad.clone() for p in model.parameters()]
        if previous is not None:
            for p, g in zip(model.parameters(), previous):
                p.grad.copy_(g)
            for opt, _ in opts:
                opt.step()
        for opt, sched in opts:
            sched.step()
            opt.zero_grad(set_to_none=True)
        previous = current
    reference = weights(model)
    for rep in sim.replicas:
        got = weights(rep.model)
        worst = max(float((got[k] - v).abs().max()) for k, v in reference.items())
        assert worst <= 1e-10, f"replica {rep.index}: max |Δw| = {worst:g}"


def applied_gradients(rule, R, steps, data, stages=None):
    """(replica, stage, step) -> the gradient each copy held at its step, with lr = 0."""
    sim = Simulator(
        make_model(dtype=torch.float64),
        "backprop",
        num_batches=steps,
        get_batch=data.__getitem__,
        batch_size=4,
        recipe=Recipe(base_lr=0.0, weight_decay=0.0),
        replicas=R,
        rule=get_rule(rule, stages=stages),
    )
    seen = {}
    sim.observers.append(
        BeforeStep(
            lambda w: seen.__setitem__(
                (w.replica, w.index, w.steps), torch.cat([p.grad.flatten() for p in w.params]).clone()
            )
        )
    )
    sim.run()
    return seen, sim


@pytest.mark.parametrize("stages,late", [(None, [9, 8, 7, 6]), (4, [8, 6, 3, 0])])
def test_with_lr_0_the_rules_apply_the_same_gradients_shifted_cell_by_cell(stages, late):
    """N = 4 replicas of a 10-stage model; L = 10 groups (one per stage) or L = 4 (3, 3, 2, 2 stages)."""
    R, steps = 4, 3
    data = make_batches(steps * R, torch.float64, batch=4)
    dp, _ = applied_gradients("dp", R, steps, data)
    cdp1, _ = applied_gradients("cdp1", R, steps, data, stages)
    cdp2, sim = applied_gradients("cdp2", R, steps, data, stages)
    J = len(sim.model)
    L, group = CDP2(stages).groups(J)
    assert group == (list(range(10)) if stages is None else [0, 0, 0, 1, 1, 1, 2, 2, 3, 3])
    pattern = [[CDP2(stages).delayed(r, stage, J) for stage in range(J)] for r in range(R)]
    assert pattern == [[group[stage] < L - 1 - r for stage in range(J)] for r in range(R)]
    assert [sum(row) for row in pattern] == late  # replica r: the stages of its first L - 1 - r groups are late
    for r in range(R):
        for stage in range(J):
            mean = {t: dp[r, stage, t] for t in range(steps)}
            assert torch.equal(mean[0], dp[0, stage, 0])  # every replica steps with the same mean under dp
            for t in range(1, steps):
                assert torch.equal(cdp1[r, stage, t], mean[t - 1]), (r, stage, t)
                assert torch.equal(cdp2[r, stage, t], mean[t - 1] if pattern[r][stage] else mean[t]), (r, stage, t)
            if not pattern[r][stage]:
                assert torch.equal(cdp2[r, stage, 0], mean[0])


def test_a_skipped_first_step_leaves_the_weights_and_advances_the_schedule():
    data = make_batches(2, torch.float64, batch=4)
    start = weights(make_model(dtype=torch.float64))
    warm = Recipe(base_lr=0.05, warmup_epochs=1.0)  # the learning rate moves at every step
    runs = {
        rule: Simulator(
            make_model(dtype=torch.float64),
            "backprop",
            num_batches=1,
            get_batch=data.__getitem__,
            batch_size=4,
            recipe=warm,
            replicas=2,
            rule=rule,
            batches_per_epoch=4,
        ).run()
        for rule in ("cdp1", "dp")
    }
    assert all(torch.equal(v, weights(runs["cdp1"].model)[k]) for k, v in start.items())
    assert not all(torch.equal(v, weights(runs["dp"].model)[k]) for k, v in start.items())
    lrs = {rule: [w.optimizer.param_groups[0]["lr"] for w in sim.workers] for rule, sim in runs.items()}
    assert lrs["cdp1"] == lrs["dp"] and all(w.steps == 1 for w in runs["cdp1"].workers)


def test_stage_groups_are_checked_with_one_line():
    with pytest.raises(ConfigError, match="rule_stages=4 is only used by replica_rule cdp1 or cdp2; replica_rule='dp'"):
        RunConfig.from_dict({"replicas": 2, "replica_rule": "dp", "rule_stages": 4})
    with pytest.raises(ValueError, match="cdp2: stages=11 groups cannot be cut from a model of 10 stages"):
        Simulator(
            make_model(),
            "backprop",
            num_batches=1,
            get_batch=make_batches(2).__getitem__,
            batch_size=6,
            replicas=2,
            rule=get_rule("cdp2", stages=11),
        )
    with pytest.raises(ValueError, match="replica rule 'dp' takes no stage groups"):
        get_rule("dp", stages=4)


COMMON = rank_argv(8, *SMALL, "--replicas", "2", "--rule", "cdp2")


@pytest.mark.slow
@pytest.mark.parametrize("positions,method,stages", [(1, "backprop", []), (2, "petra", ["--rule-stages", "4"])])
def test_cdp2_on_ranks_matches_the_simulator(tmp_path, positions, method, stages):
    argv_ = [*COMMON, *stages, "--method", method, "--save", str(tmp_path / "{method}.pt")]
    procs = launch_local(argv_, 2 * positions, timeout=200, capture=True, script=RANKS)
    check_outcome(procs)
    assert_bit_for_bit(torch.load(tmp_path / f"{method}.pt"), simulator_state(argv_, method), method)


@pytest.mark.slow
def test_a_cdp2_run_resumes_bit_for_bit(tmp_path, monkeypatch):
    config = argv(
        tiny_run(
            synthetic_train=128, synthetic_test=64, batch_size=16, k=1, method="petra", replicas=2, replica_rule="cdp2"
        )
    )
    whole, cut = whole_and_resumed(config, tmp_path)
    for name in ("history.json", "metrics.json"):
        assert untimed(json.loads((cut / name).read_text())) == untimed(json.loads((whole / name).read_text()))
    a = torch.load(whole / "checkpoint.pt", weights_only=False)
    b = torch.load(cut / "checkpoint.pt", weights_only=False)
    for part in ("model", *(f"replica_models.{r}" for r in (1,))):
        sa = a["model"] if part == "model" else a["replica_models"][1]
        sb = b["model"] if part == "model" else b["replica_models"][1]
        assert all(torch.equal(v, sb[k]) for k, v in sa.items()), part


def test_a_cdp_run_can_evaluate_the_replicas_average_as_the_official_code_does(tmp_path):
    """``evaluated_model=average``: the run's final test record is the replicas' weight average's (the
    population record's ``average_top1``, made by the same mean), replica 0's kept as ``replica0_*``;
    ``both``: replica 0's as the run's, the average's beside it."""
    from petra_core.cli import main

    runs = {}
    for choice in ("average", "both"):
        config = tiny_run(
            synthetic_train=64,
            synthetic_test=32,
            batch_size=16,
            epochs=1,
            replicas=2,
            replica_rule="cdp2",
            bn_reestimate_batches=0,
            evaluated_model=choice,
        )
        assert main(["train", *argv(config), "--run-dir", str(tmp_path / choice)]) == 0
        runs[choice] = (
            json.loads((tmp_path / choice / "metrics.json").read_text()),
            json.loads((tmp_path / choice / "history.json").read_text())[-1],
        )
    metrics, last = runs["average"]
    assert metrics["top1"] == metrics["population"]["average_top1"]
    assert (metrics["replica0_top1"], metrics["replica0_top5"], metrics["replica0_test_loss"]) == (
        last["top1"],
        last["top5"],
        last["test_loss"],
    )
    both, last = runs["both"]
    assert both["top1"] == last["top1"] and both["average_top1"] == both["population"]["average_top1"]
    assert both["average_top1"] == metrics["top1"] and both["average_test_loss"] == metrics["test_loss"]
    assert "replica0_top1" not in both


def test_the_evaluated_model_is_refused_in_one_line_where_it_means_nothing():
    from petra_core.run.config import ConfigError, RunConfig

    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"evaluated_model": "average"})
    assert str(err.value) == (
        "evaluated_model='average' needs replicas >= 2 (one model is its own average); use evaluated_model=replica0"
    )
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"evaluated_model": "mean", "replicas": 2})
    assert str(err.value) == "evaluated_model='mean' is not allowed; allowed: replica0, average, both"
