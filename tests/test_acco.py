"""Sharded data parallelism and ACCO (petra_core/replicas/sharded.py, acco.py) against closed forms.

* a sharded optimizer step (SGD and AdamW, slices cutting tensors anywhere) gives the unsharded
  step's bits, and ``zero1`` gives ``dp``'s bits end to end;
* a tentative step (snapshot, step, restore) leaves the shard and its optimizer state bit for bit
  as they were;
* with lr = 0 ACCO's real rounds apply exactly DDP's mean gradient over the same micro-batches;
  with lr > 0 its weights and applied gradients follow the closed form (the count-weighted mean of
  ∇F at θ̃_t on the first half and at θ_t on the second, θ̃_{t+1} from a discarded step), float64;
* ``dpu`` is the closed form with a one-step delay after its warm-up (and ``cdp1`` at warm-up 0),
  ``wp`` its weight-predicting variant;
* ACCO with a fixed count on 2 gloo ranks gives the simulator's bits; a ``petra train`` run of it
  resumes bit for bit.
"""

import copy
import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import SMALL, BeforeStep, argv, make_batches, make_model, rank_argv, tiny_run, untimed, whole_and_resumed

from petra_core import Recipe, Simulator
from petra_core.optim import make_optimizer, param_groups
from petra_core.replicas import get_rule
from petra_core.replicas.sharded import FlatLayout, ShardedOptimizer

OPTIMIZERS = {
    "sgd": Recipe(base_lr=0.05, weight_decay=5e-4),
    "adamw": Recipe(base_lr=0.002, weight_decay=5e-4, optimizer="adamw"),
    # ACCO's official β2 = 0.95 (it reaches the shards' optimizers)
    "adamw-official": Recipe(base_lr=0.002, weight_decay=5e-4, optimizer="adamw", betas=(0.9, 0.95)),
}


def module_with_groups(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 7, 3), torch.nn.BatchNorm2d(7), torch.nn.Flatten(), torch.nn.Linear(7 * 4 * 4, 5)
    )


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("R", [2, 3, 7])
def test_a_sharded_step_equals_the_unsharded_step_bit_for_bit(name, R):
    full = module_with_groups()
    opt, _ = make_optimizer(full, OPTIMIZERS[name], batch_size=64, k=1, steps_per_epoch=10)
    layout = FlatLayout(opt, R)  # two parameter groups (decayed weights; batch norm and biases)
    shards = [ShardedOptimizer(opt, layout, r) for r in range(R)]
    assert sum(s.hi - s.lo for s in shards) == layout.n and layout.n > layout.S * (R - 1)
    g = torch.Generator().manual_seed(1)
    for step in range(4):
        for p in full.parameters():
            p.grad = torch.randn(p.shape, generator=g)
        flat, lrs = layout.grads(), [grp["lr"] for grp in opt.param_groups]
        opt.step()
        gathered = torch.cat([s.step(flat[r * layout.S : (r + 1) * layout.S], lrs) for r, s in enumerate(shards)])
        assert torch.equal(gathered, layout.values()), f"{name}, R={R}, step {step}"
    unsharded = sum(
        v.numel() * v.element_size()
        for s in opt.state.values()
        for v in s.values()
        if torch.is_tensor(v) and v.numel() > 1
    )
    sharded = max(s.state_bytes() for s in shards)
    assert sharded < unsharded / R + 64 * 4  # 1/R of the moments (and a few step counters)


def test_a_tentative_step_leaves_the_shard_and_its_optimizer_state_bit_for_bit_unchanged():
    m = module_with_groups()
    opt, _ = make_optimizer(m, OPTIMIZERS["adamw"], batch_size=64, k=1, steps_per_epoch=10)
    layout = FlatLayout(opt, 2)
    shard, twin = ShardedOptimizer(opt, layout, 1), ShardedOptimizer(opt, layout, 1)
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(layout.S, generator=g) for _ in range(4)]
    for grad in grads[:2]:
        shard.step(grad, [1e-3, 1e-3])
        twin.step(grad, [1e-3, 1e-3])
    before = copy.deepcopy(shard.state_dict())
    snap = shard.snapshot()
    shard.step(grads[2], [1e-3, 1e-3])  # the tentative step
    shard.restore(snap)
    after = shard.state_dict()
    assert all(torch.equal(a, b) for a, b in zip(before["tensors"], after["tensors"]))
    for key, state in before["optimizer"]["state"].items():
        assert all(torch.equal(v, after["optimizer"]["state"][key][n]) for n, v in state.items())
    # and the next real step is the one the twin, which never stepped tentatively, takes
    assert torch.equal(shard.step(grads[3], [1e-3, 1e-3]), twin.step(grads[3], [1e-3, 1e-3]))


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("R", [2, 3])
def test_zero1_is_dp_bit_for_bit(name, R):
    data = make_batches(6 * R, batch=4)
    states = {}
    for rule in ("dp", "zero1"):
        sim = Simulator(
            make_model(),
            "backprop",
            num_batches=6,
            get_batch=data.__getitem__,
            batch_size=4,
            k=2,
            recipe=OPTIMIZERS[name],
            replicas=R,
            rule=rule,
        ).run()
        states[rule] = [copy.deepcopy(rep.model.state_dict()) for rep in sim.replicas]
    for r in range(R):
        differ = [k for k, v in states["dp"][r].items() if not torch.equal(v, states["zero1"][r][k])]
        assert not differ, f"replica {r}: {differ[:3]}"


# ---- the closed forms ---------------------------------------------------------------------------------
def weights(m):
    return {k: v for k, v in m.state_dict().items() if "running" not in k and "num_batches" not in k}


def simulate(rule, R, steps, k, data, recipe, record=False):
    rule = get_rule(rule[0], options=rule[1]) if isinstance(rule, tuple) else get_rule(rule)
    rule.record = record
    sim = Simulator(
        make_model(dtype=torch.float64),
        "backprop",
        num_batches=steps * k,
        get_batch=data.__getitem__,
        batch_size=4,
        k=k,
        recipe=recipe,
        replicas=R,
        rule=rule,
    ).run()
    return sim, rule


class ClosedForm:
    """One model, per-stage optimizers of the recipe, gradients summed by hand."""

    def __init__(self, recipe, R, k, steps, data):
        self.model = make_model(dtype=torch.float64)
        self.opts = [
            make_optimizer(stage, recipe, batch_size=4 * R, k=k, steps_per_epoch=steps) for stage in self.model
        ]
        self.R, self.k, self.data = R, k, data

    def grad_at(self, theta, micro_batches):
        """Σ over replicas and the given micro-batch numbers of ∇ℓ at weights ``theta``, / (R · count)."""
        scratch = copy.deepcopy(self.model)
        scratch.load_state_dict(theta, strict=False)
        scratch.zero_grad(set_to_none=True)
        for i in micro_batches:
            for r in range(self.R):
                x, y = self.data[i * self.R + r]
                (F.cross_entropy(scratch(x), y) / (self.R * len(micro_batches))).backward()
        return [p.grad.clone() for p in scratch.parameters()]

    def step(self, grads, tentative=False):
        """Opt(θ, grads) from the committed state; a tentative step returns its weights and undoes itself."""
        saved = (copy.deepcopy(weights(self.model)), [copy.deepcopy(o.state_dict()) for o, _ in self.opts])
        for p, g in zip(self.model.parameters(), grads):
            p.grad = g.clone()
        for o, _ in self.opts:
            o.step()
            o.zero_grad(set_to_none=True)
        made = copy.deepcopy(weights(self.model))
        if tentative:
            self.model.load_state_dict(saved[0], strict=False)
            for (o, _), s in zip(self.opts, saved[1]):
                o.load_state_dict(s)
        return made

    def schedule(self):
        for _, sched in self.opts:
            sched.step()


def flat_in_layout(model, grads):
    """Per-parameter gradients as each stage's flat vector in its optimizer's group order."""
    by_id = dict(zip(map(id, model.parameters()), grads))
    out = []
    for stage in model:
        groups = param_groups(stage.named_parameters(), 1.0)
        out.append(torch.cat([by_id[id(p)].reshape(-1) for g in groups for p in g["params"]]))
    return out


def applied(rule, stage, step, R, n):
    return torch.cat([rule.applied[stage, r, step] for r in range(R)])[:n]


def assert_close(got, reference, what, tol=1e-10):
    worst = max(float((got[k] - v).abs().max()) for k, v in reference.items())
    assert worst <= tol, f"{what}: max |Δw| = {worst:g}"


def test_with_lr_0_acco_applies_exactly_ddps_mean_gradient():
    R, k, steps = 2, 4, 3
    data = make_batches(steps * k * R, torch.float64, batch=4)
    still = Recipe(base_lr=0.0, weight_decay=0.0)
    dp = Simulator(
        make_model(dtype=torch.float64),
        "backprop",
        num_batches=steps * k,
        get_batch=data.__getitem__,
        batch_size=4,
        k=k,
        recipe=still,
        replicas=R,
    )
    seen = {}
    dp.observers.append(
        BeforeStep(
            lambda w: (
                seen.__setitem__((w.index, w.steps), [p.grad.clone() for p in w.params]) if w.replica == 0 else None
            )
        )
    )
    dp.run()
    _, rule = simulate("acco", R, steps, k, data, still, record=True)
    for (j, t), grads in seen.items():
        stage = dp.model[j]
        by_id = dict(zip(map(id, stage.parameters()), grads))
        mean = torch.cat(
            [by_id[id(p)].reshape(-1) for g in param_groups(stage.named_parameters(), 1.0) for p in g["params"]]
        )
        worst = float((applied(rule, j, t, R, mean.numel()) - mean).abs().max())
        assert worst <= 1e-10, f"stage {j}, step {t}: {worst:g}"


@pytest.mark.parametrize("first_round", ["petra", "official"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_acco_follows_its_closed_form(name, first_round):
    """Step t's first half holds h = k // 2 micro-batches; with ``first_round=official`` step 0's
    holds one (the authors' first round)."""
    R, k, steps = 2, 4, 4
    data = make_batches(steps * k * R, torch.float64, batch=4)
    sim, rule = simulate(("acco", {"first_round": first_round}), R, steps, k, data, OPTIMIZERS[name], record=True)
    assert [rule.half(SimpleNamespace(steps=t, k=k)) for t in range(3)] == (
        [2, 2, 2] if first_round == "petra" else [1, 2, 2]
    )

    ref = ClosedForm(OPTIMIZERS[name], R, k, steps, data)
    tilde = weights(ref.model)
    for t in range(steps):
        h = 1 if first_round == "official" and t == 0 else k // 2
        first = range(t * k, t * k + h)
        second = range(t * k + h, (t + 1) * k)
        g_tilde = ref.grad_at(tilde, first)  # the mean over the first half, at θ̃_t
        g_real = ref.grad_at(weights(ref.model), second)  # the mean over the second half, at θ_t
        mean = [(a * h + b * (k - h)) / k for a, b in zip(g_tilde, g_real)]  # count-weighted
        next_tilde = ref.step(g_tilde, tentative=True)
        ref.step(mean)
        ref.schedule()
        for j, flat in enumerate(flat_in_layout(ref.model, mean)):
            worst = float((applied(rule, j, t, R, flat.numel()) - flat).abs().max())
            assert worst <= 1e-10, f"{name}: stage {j}, step {t}: the applied gradient is off by {worst:g}"
        tilde = next_tilde
    for rep in sim.replicas:
        assert_close(weights(rep.model), weights(ref.model), f"{name}, replica {rep.index}")


@pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")
@pytest.mark.parametrize("warmup", [0, 2])
def test_dpu_is_the_closed_form_with_a_one_step_delay_after_its_warmup(warmup):
    R, k, steps = 2, 1, 6
    data = make_batches(steps * R, torch.float64, batch=4)
    sim, _ = simulate(("dpu", {"warmup": warmup}), R, steps, k, data, OPTIMIZERS["sgd"])
    ref = ClosedForm(OPTIMIZERS["sgd"], R, k, steps, data)
    previous = None
    for t in range(steps):
        g = ref.grad_at(weights(ref.model), [t])  # ḡ_t, at θ_t
        if t < warmup:
            ref.step(g)
        elif t > warmup:
            ref.step(previous)  # θ_{t+1} = Opt(θ_t, ḡ_{t-1}); step `warmup` applies nothing new
        ref.schedule()
        previous = g
    for rep in sim.replicas:
        assert_close(weights(rep.model), weights(ref.model), f"dpu warmup={warmup}, replica {rep.index}")


def test_dpu_without_warmup_is_cdp1_bit_for_bit():
    data = make_batches(6 * 2, batch=4)
    states = [
        Simulator(
            make_model(),
            "backprop",
            num_batches=6,
            get_batch=data.__getitem__,
            batch_size=4,
            recipe=OPTIMIZERS["sgd"],
            replicas=2,
            rule=rule,
        )
        .run()
        .model.state_dict()
        for rule in ("dpu", "cdp1")
    ]
    assert all(torch.equal(v, states[1][key]) for key, v in states[0].items())


@pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")
def test_weight_prediction_is_dpu_computing_at_the_predicted_weights():
    R, k, steps = 2, 1, 6
    data = make_batches(steps * R, torch.float64, batch=4)
    sim, _ = simulate("wp", R, steps, k, data, OPTIMIZERS["sgd"])
    ref = ClosedForm(OPTIMIZERS["sgd"], R, k, steps, data)
    theta0 = weights(ref.model)
    hat, grads = {1: theta0, 2: theta0}, {}
    for s in range(steps):
        grads[s] = ref.grad_at(hat[s + 1], [s])  # step s computes at θ̂_{s+1}
        if s >= 1:
            ref.step(grads[s - 1])  # θ_{s+1} = Opt(θ_s, ḡ_{s-1})
            hat[s + 2] = ref.step(grads[s - 1], tentative=True)  # θ̂_{s+2} = Opt(θ_{s+1}, ḡ_{s-1}), undone
        ref.schedule()
    for rep in sim.replicas:
        assert_close(weights(rep.model), weights(ref.model), f"wp, replica {rep.index}")


def test_bad_acco_setups_are_one_line():
    data = make_batches(4, batch=4)
    cases = [
        (dict(k=1, method="backprop"), "needs k >= 2"),
        (dict(k=2, method="petra"), "runs on the sequential schedule; the method's is 'pipelined'"),
        (dict(k=2, method="1f1b"), "runs on the sequential schedule; the method's is '1f1b'"),  # one a flush only
    ]
    for kwargs, needle in cases:
        with pytest.raises(ValueError) as err:
            Simulator(
                make_model(),
                kwargs["method"],
                num_batches=2,
                get_batch=data.__getitem__,
                batch_size=4,
                k=kwargs["k"],
                replicas=2,
                rule="acco",
            )
        assert needle in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="warmup=-1 is not allowed"):
        get_rule("dpu", options={"warmup": -1})
    with pytest.raises(ValueError) as err:
        get_rule("acco", options={"first_round": "one"})
    assert str(err.value) == "acco: first_round='one' is not allowed; allowed: petra, official"


# ---- on ranks, and resumed ------------------------------------------------------------------------------
COMMON = rank_argv(8, *SMALL, "--replicas", "2", "--k", "4", "--method", "backprop")


@pytest.mark.slow
@pytest.mark.parametrize("rule,positions", [("acco", 1), ("acco", 2), ("wp", 1)])
def test_sharded_rules_on_ranks_match_the_simulator(tmp_path, rule, positions):
    """N = 2 on gloo ranks (rounds on each rank's communication thread, reduce-scatter and
    all-gather over the replica axis) gives the simulator's bits."""
    from harness.compare import assert_bit_for_bit, check_outcome, simulator_state
    from harness.ranks import RANKS

    from petra_core.engine.launch import launch_local

    argv_ = [*COMMON, "--rule", rule, "--save", str(tmp_path / "{method}.pt")]
    procs = launch_local(argv_, 2 * positions, timeout=200, capture=True, script=RANKS)
    check_outcome(procs)
    assert_bit_for_bit(torch.load(tmp_path / "backprop.pt"), simulator_state(argv_, "backprop"), "backprop")


def test_an_acco_run_resumes_bit_for_bit(tmp_path, monkeypatch):
    config = argv(
        tiny_run(
            synthetic_train=128,
            synthetic_test=64,
            batch_size=8,
            k=2,
            replicas=2,
            replica_rule="acco",
            method="backprop",
            optimizer="adamw",
            base_lr=0.01,
        )
    )
    whole, cut = whole_and_resumed(config, tmp_path)
    a, b = (json.loads((d / "metrics.json").read_text()) for d in (whole, cut))
    assert untimed(a) == untimed(b)
    for name in ("history.json",):
        assert untimed(json.loads((whole / name).read_text())) == untimed(json.loads((cut / name).read_text()))


@pytest.mark.slow
def test_the_overlap_benchmark_runs_acco_in_timing_mode_against_ddp_and_zero1(tmp_path):
    """benchmarks/bench_acco.py on 2 gloo ranks, tiny: every setting and method reported; DDP and
    ZeRO-1 compute exactly 2n micro-batches a step on each rank, ACCO at least n a round (more
    while a round is still running); the memory table shards AdamW's state 1/N."""
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "overlap.json"
    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_acco.py"
    subprocess.run(
        [
            sys.executable,
            str(bench),
            "--width",
            "4",
            "--batch",
            "4",
            "--steps",
            "3",
            "--n",
            "1",
            "--memory-width",
            "4",
            "--json",
            str(out),
            "--record",
        ],
        check=True,
        capture_output=True,
        timeout=600,
        cwd=tmp_path,
    )
    report = json.loads(out.read_text())
    from petra_core.report.readme import render_benchmarks

    assert "**ACCO's overlap**" in render_benchmarks(tmp_path / "results")  # its record, rendered
    assert [s["setting"] for s in report["settings"]] == ["loopback", "1 Gbit/s", "1 Gbit/s, rank 1 2x slower"]
    for setting in report["settings"]:
        methods = setting["methods"]
        assert methods["ddp"]["micro_batches"] == methods["zero1"]["micro_batches"] == 2 * 2
        assert methods["acco"]["micro_batches"] >= 2 * 2
        assert 0 < setting["ideal"] <= 1
    for row in report["memory"]:
        assert row["zero1_optimizer_state"] <= row["dp_optimizer_state"] / row["replicas"] + 4 * 64


def test_a_rule_with_equal_replicas_evaluates_replica_0_as_its_average(tmp_path):
    """``evaluated_model=both`` under ``acco`` (every replica holds the same weights): the average is
    replica 0, so its record is replica 0's."""
    from petra_core.cli import main

    config = tiny_run(
        synthetic_train=64, synthetic_test=32, batch_size=8, epochs=1, k=2, method="backprop", replicas=2,
        replica_rule="acco", bn_reestimate_batches=0, evaluated_model="both",
    )  # fmt: skip
    assert main(["train", *argv(config), "--run-dir", str(tmp_path / "run")]) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert (metrics["average_top1"], metrics["average_test_loss"]) == (metrics["top1"], metrics["test_loss"])
    assert "population" not in metrics
