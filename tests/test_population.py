"""Population rules (petra_core/replicas/population.py): ``independent``, ``papa``, ``wash``, against
their closed forms: a shuffle is a permutation, p = 0 is independent training, PAPA at λ = 1 every
step keeps every model at the average, the selected fraction of each tensor is p_k."""

import math
from types import SimpleNamespace

import pytest
import torch
from conftest import SMALL, make_batches, make_model, rank_argv

from petra_core import Recipe, Simulator
from petra_core.engine.worlds import LocalReplicaGroup
from petra_core.replicas import get_rule
from petra_core.replicas.population import PAPA, WASH, draw_generator, step_in_epoch

LR = Recipe(base_lr=0.05, weight_decay=5e-4, scale_lr=False)


def fake_copies(replicas=4, shapes=((6, 5), (7,), (3, 4, 2)), steps=1, seed=0):
    """R copies of one stage whose parameters hold distinct values, with momentum buffers."""
    g = torch.Generator().manual_seed(seed)
    copies = []
    for r in range(replicas):
        params = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        for p in params:
            opt.state[p]["momentum_buffer"] = torch.randn(p.shape, generator=g)
        copies.append(
            SimpleNamespace(
                index=2,
                replica=r,
                params=params,
                optimizer=opt,
                steps=steps,
                tensor_offset=0,
                tensors_total=len(shapes),
                stage=torch.nn.Module(),
            )
        )
    return copies


def test_a_wash_shuffle_is_a_permutation_of_every_scalar_across_the_models():
    copies = fake_copies()
    before = [torch.stack([c.params[i].detach().clone() for c in copies]) for i in range(3)]
    momenta = [
        torch.stack([c.optimizer.state[c.params[i]]["momentum_buffer"].clone() for c in copies]) for i in range(3)
    ]
    group = LocalReplicaGroup(4)
    WASH(p=0.6).after_step(copies, group)
    after = [torch.stack([c.params[i].detach() for c in copies]) for i in range(3)]
    moved = 0
    for b, a in zip(before, after):
        assert torch.equal(b.sort(0).values, a.sort(0).values)  # each scalar's multiset over the models, exactly
        moved += int((a != b).any(0).sum())
    assert moved > 0
    # the momentum travels with its weight: (weight, momentum) pairs are permuted together
    for i in range(3):
        pairs_before = {(float(w), float(m)) for w, m in zip(before[i].flatten(), momenta[i].flatten())}
        after_m = torch.stack([c.optimizer.state[c.params[i]]["momentum_buffer"] for c in copies])
        assert {(float(w), float(m)) for w, m in zip(after[i].flatten(), after_m.flatten())} == pairs_before
    assert group.floats_sent > 0


def test_a_shuffle_moves_the_same_scalar_in_channels_last_weights_and_their_momenta():
    """Selected positions are logical coordinates: a channels-last weight (whose flat memory order
    is not its logical order) and a contiguous momentum buffer move the same scalars together."""
    copies = fake_copies(replicas=3, shapes=((4, 3, 2, 2),))
    for c in copies:
        p = c.params[0]
        p.data = p.data.to(memory_format=torch.channels_last)
        c.optimizer.state[p]["momentum_buffer"] = p.detach().clone(memory_format=torch.contiguous_format) * 2
    WASH(p=0.7).after_step(copies, LocalReplicaGroup(3))
    for c in copies:
        p = c.params[0]
        assert p.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(c.optimizer.state[p]["momentum_buffer"], p.detach() * 2)  # still paired


def test_the_selected_fraction_of_each_tensor_is_its_layer_aware_probability():
    """p_k = p·(1 − k/(K−1)); over 10,000 draws the fraction selected is within 3 standard errors."""
    rule = WASH(p=0.2)
    copy = SimpleNamespace(
        index=0, params=[torch.zeros(10), torch.zeros(10), torch.zeros(10)], tensor_offset=0, tensors_total=3
    )
    counts = [0, 0, 0]
    draws = 10_000
    for step in range(draws // 10):  # 10 scalars per tensor and draw: 10,000 Bernoulli draws per tensor
        for i, chosen, perms in rule.selection(copy, step, 4):
            counts[i] += chosen.numel()
            assert perms.shape == (chosen.numel(), 4) and torch.equal(perms.sort(1).values[0], torch.arange(4))
    for k, count in enumerate(counts):
        pk = WASH.probability(0.2, k, 3)
        se = math.sqrt(pk * (1 - pk) / draws) if 0 < pk < 1 else 0.0
        assert abs(count / draws - pk) <= 3 * se + 1e-12, (k, count / draws, pk)
    assert [WASH.probability(0.2, k, 3) for k in range(3)] == [0.2, 0.1, 0.0]


def test_every_replica_draws_the_same_selection():
    a = draw_generator(3, 7, 2).initial_seed()
    assert a == draw_generator(3, 7, 2).initial_seed() != draw_generator(3, 8, 2).initial_seed()


def train(rule, replicas=2, method="backprop", n=6):
    model = make_model(method=method)
    batches = make_batches(n * replicas)
    sim = Simulator(
        model,
        method,
        num_batches=n,
        get_batch=batches.__getitem__,
        batch_size=6,
        recipe=LR,
        replicas=replicas,
        rule=rule,
    )
    sim.run()
    return [rep.model.state_dict() for rep in sim.replicas]


def equal_states(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("method", ["backprop", "petra"])
def test_wash_at_p_0_is_independent_training_bit_for_bit(method):
    wash = train(get_rule("wash", options={"p": 0.0}), method=method)
    independent = train(get_rule("independent"), method=method)
    assert all(equal_states(a, b) for a, b in zip(wash, independent))
    assert not equal_states(independent[0], independent[1])  # each replica trains on its own minibatches
    shuffled = train(get_rule("wash", options={"p": 0.5}), method=method)
    assert not equal_states(shuffled[0], independent[0])


def test_papa_at_full_strength_every_step_keeps_every_model_at_the_average():
    states = train(get_rule("papa", options={"rate": 1.0, "every": 1, "scale_with_lr": False}), replicas=3)
    for s in states[1:]:
        floats = [k for k, v in states[0].items() if v.is_floating_point()]
        assert all(torch.allclose(s[k], states[0][k], rtol=0, atol=1e-6) for k in floats)
    assert not equal_states(*train(get_rule("independent"), replicas=2))


def test_papa_moves_each_model_towards_the_average_by_its_rate():
    copies = fake_copies(replicas=3, steps=10)
    for c in copies:
        c.optimizer.param_groups[0]["initial_lr"] = 0.2  # lr 0.1 of a base 0.2: λ = rate / 2
    before = [torch.stack([c.params[i].detach().clone() for c in copies]) for i in range(3)]
    PAPA(rate=0.5).after_step(copies, LocalReplicaGroup(3))
    for i, b in enumerate(before):
        expected = (1 - 0.25) * b + 0.25 * b.mean(0, keepdim=True)
        assert torch.allclose(torch.stack([c.params[i].detach() for c in copies]), expected, atol=1e-6)
    copies[0].steps = copies[1].steps = copies[2].steps = 11  # not a multiple of every=10: nothing moves
    frozen = [c.params[0].detach().clone() for c in copies]
    PAPA(rate=0.5).after_step(copies, LocalReplicaGroup(3))
    assert all(torch.equal(c.params[0], f) for c, f in zip(copies, frozen))


def averaging_steps(phase, every, k, batches_per_epoch, steps):
    """The 0-based steps after which ``papa`` averages, asked step by step as the runner does."""
    rule = PAPA(every=every, phase=phase)
    copy = SimpleNamespace(k=k, batches_per_epoch=batches_per_epoch, steps=0)
    taken = []
    for s in range(steps):
        copy.steps = s + 1  # after step s
        if rule.averages_after(copy):
            taken.append(s)
    return taken


def test_papa_averages_after_steps_every_2every_in_petras_phase_and_from_0_each_epoch_in_the_official_one():
    # petra: after steps every, 2·every, ... (1-based), whatever the epochs
    assert averaging_steps("petra", 10, 1, 25, 60) == [9, 19, 29, 39, 49, 59]
    # official: i counted from 0 in each epoch of 25 steps, i % 10 == 0
    assert averaging_steps("official", 10, 1, 25, 60) == [0, 10, 20, 25, 35, 45, 50]
    # k = 2 over epochs of 24 minibatches: 12 steps an epoch
    assert averaging_steps("official", 5, 2, 24, 30) == [0, 5, 10, 12, 17, 22, 24, 29]
    # an epoch k does not divide (7 minibatches, k = 2): a step belongs to its first minibatch's epoch
    assert [step_in_epoch(s, 2, 7) for s in range(8)] == [0, 1, 2, 3, 0, 1, 2, 0]


def test_papas_official_phase_averages_on_the_steps_it_names_in_a_run():
    # after step 0 (official) every model sits at the average at full strength; petra's phase
    # with every=2 leaves a run of one step alone
    def one_step(phase):
        rule = get_rule("papa", options={"rate": 1.0, "every": 2, "scale_with_lr": False, "phase": phase})
        return train(rule, replicas=2, n=1)

    official, petra = one_step("official"), one_step("petra")
    floats = [k for k, v in official[0].items() if v.is_floating_point()]
    assert all(torch.allclose(official[1][k], official[0][k], rtol=0, atol=1e-6) for k in floats)
    assert not equal_states(*petra)
    assert all(equal_states(a, b) for a, b in zip(petra, train(get_rule("independent"), replicas=2, n=1)))


def test_the_average_model_holds_the_replicas_mean_and_replica0s_integer_buffers():
    from petra_core.run.population import average_model, evaluated_record

    models = [make_model(seed=s) for s in (0, 1, 2)]
    average = average_model(models)
    states = [m.state_dict() for m in models]
    for key, value in average.state_dict().items():
        if value.is_floating_point():
            assert torch.allclose(value, sum(s[key] for s in states) / 3, rtol=0, atol=1e-6), key
        else:
            assert torch.equal(value, states[0][key]), key
    assert evaluated_record("replica0", models, None, {}) == {}  # nothing evaluated again
    with pytest.raises(ValueError, match=r"^evaluated_model='mean' is not allowed; allowed: replica0, average, both$"):
        evaluated_record("mean", models, None, {})


def test_different_initialisations_are_drawn_per_replica_the_same_on_every_run():
    a = train(get_rule("independent", options={"init": "different"}), n=1)
    b = train(get_rule("independent", options={"init": "different"}), n=1)
    same = train(get_rule("independent"), n=1)
    assert all(equal_states(x, y) for x, y in zip(a, b))
    assert equal_states(a[0], same[0]) and not equal_states(a[1], same[1])


def test_bad_population_options_are_one_line():
    for name, options, needle in (
        ("wash", {"p": 2}, "wash: p=2 is not allowed; allowed: 0 <= p <= 1"),
        ("papa", {"every": 0}, "papa: every=0 is not allowed"),
        ("papa", {"phase": "epoch"}, "papa: phase='epoch' is not allowed; allowed: petra, official"),
        ("independent", {"init": "random"}, "independent: init='random' is not allowed; allowed: same, different"),
        ("wash", {"q": 1}, "replica rule 'wash' has no option 'q'; allowed: init, p, momentum"),
    ):
        with pytest.raises(ValueError) as err:
            get_rule(name, options=options)
        assert needle in str(err.value) and "\n" not in str(err.value)


COMMON = rank_argv(8, *SMALL, "--replicas", "2")


@pytest.mark.slow
@pytest.mark.parametrize(
    "rule,options,method,positions",
    [
        ("wash", '{"p": 0.2}', "backprop", 1),
        ("papa", '{"rate": 0.5, "every": 2}', "backprop", 1),
        ("wash", '{"p": 0.2, "init": "different"}', "petra", 2),
    ],
)
def test_population_rules_on_ranks_match_the_simulator(tmp_path, rule, options, method, positions):
    """N = 2 on gloo ranks (the shuffled entries all-gathered, PAPA's average all-reduced) gives
    the simulator's bits."""
    from harness.compare import assert_bit_for_bit, check_outcome, simulator_state
    from harness.ranks import RANKS

    from petra_core.engine.launch import launch_local

    argv_ = [
        *COMMON,
        "--rule",
        rule,
        "--rule-options",
        options,
        "--method",
        method,
        "--save",
        str(tmp_path / "{method}.pt"),
    ]
    procs = launch_local(argv_, 2 * positions, timeout=200, capture=True, script=RANKS)
    check_outcome(procs)
    assert_bit_for_bit(torch.load(tmp_path / f"{method}.pt"), simulator_state(argv_, method), method)


def test_a_population_run_reports_members_ensemble_average_and_communication(tmp_path):
    import json

    from conftest import argv, tiny_run

    from petra_core.cli import main

    config = tiny_run(
        synthetic_train=128,
        synthetic_test=64,
        batch_size=16,
        replicas=2,
        replica_rule="wash",
        rule_options="{p: 0.05}",
        bn_reestimate_batches=2,
        channels_last=True,
    )  # as the wash profile
    assert main(["train", *argv(config), "--run-dir", str(tmp_path / "wash")]) == 0
    metrics = json.loads((tmp_path / "wash" / "metrics.json").read_text())
    pop = metrics["population"]
    assert pop["replicas"] == 2 and len(pop["members_top1"]) == 2
    assert pop["members_top1_mean"] == sum(pop["members_top1"]) / 2
    assert {"ensemble_top1", "average_top1", "average_top1_bn_reestimated"} <= pop.keys()
    assert pop["bn_reestimate_batches"] == 2
    assert metrics["floats_sent_per_step"] > 0
    # dp: one flat gradient per stage and step, so exactly the model's parameter count per step
    dp = {**config, "replica_rule": "dp"}
    dp.pop("rule_options")
    assert main(["train", *argv(dp), "--run-dir", str(tmp_path / "dp")]) == 0
    dp_metrics = json.loads((tmp_path / "dp" / "metrics.json").read_text())
    assert dp_metrics["floats_sent_per_step"] == dp_metrics["params"]


def test_a_wash_run_resumes_bit_for_bit_with_its_communication_count(tmp_path, monkeypatch):
    import json

    from conftest import argv, tiny_run, untimed, whole_and_resumed

    config = argv(
        tiny_run(
            synthetic_train=128,
            synthetic_test=64,
            batch_size=16,
            replicas=2,
            replica_rule="wash",
            rule_options="{p: 0.05}",
            method="petra",
        )
    )
    whole, cut = whole_and_resumed(config, tmp_path)
    a, b = (json.loads((d / "metrics.json").read_text()) for d in (whole, cut))
    assert untimed(a) == untimed(b)
