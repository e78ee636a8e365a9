"""Replica rules (petra_core/replicas/) in the simulator: the dp rule against its closed form.

* ``dp`` with R replicas of batch b under the sequential schedule trains exactly like one replica
  accumulating the same R minibatches with k = R (float64, ≤ 1e-10), for backprop and PETRA's
  sequential counterpart; batch-norm running statistics are compared separately (R replicas
  update theirs R times as often, each from its own minibatches);
* the replicas' shards of the stream are disjoint and cover it in turn;
* under a pipelined method the replicas stay identical in their weights;
* rules are looked up by name, with one-line errors;
* what a rule takes and needs is declared on its class (options, replicas > 1, schedules): a toy
  rule declared here works once registered, and an undeclared option or a combination its
  declaration refuses fails at build time with one line.
"""

from dataclasses import dataclass

import pytest
import torch
from conftest import make_batches, make_model

from petra_core import Recipe, Simulator
from petra_core.engine.observers import Observer
from petra_core.methods.schedule import Sequential
from petra_core.replicas import REPLICA_RULES, DataParallel, ReplicaRule, RuleOptions, get_rule, register_rule
from petra_core.run.config import ConfigError, RunConfig

LR = Recipe(base_lr=0.05, weight_decay=5e-4, scale_lr=True)


def weights(m):
    return {k: v for k, v in m.state_dict().items() if "running" not in k and "num_batches" not in k}


@pytest.mark.parametrize("method", ["backprop", "revbackprop"])
@pytest.mark.parametrize("R", [2, 3])
def test_dp_equals_one_replica_accumulating_R_minibatches(method, R):
    steps = 3
    data = make_batches(steps * R, torch.float64, batch=4)
    one = Simulator(
        make_model(dtype=torch.float64),
        method,
        num_batches=steps * R,
        get_batch=data.__getitem__,
        batch_size=4,
        k=R,
        recipe=LR,
    ).run()
    many = Simulator(
        make_model(dtype=torch.float64),
        method,
        num_batches=steps,
        get_batch=data.__getitem__,
        batch_size=4,
        k=1,
        recipe=LR,
        replicas=R,
        rule="dp",
    ).run()
    assert [w.steps for w in many.workers] == [w.steps for w in one.workers] == [steps] * len(one.workers)
    reference = weights(one.model)
    for rep in many.replicas:
        got = weights(rep.model)
        worst = max(float((got[k] - v).abs().max()) for k, v in reference.items())
        assert worst <= 1e-10, f"replica {rep.index}: max |Δw| = {worst:g}"
    # running statistics: each replica updated its own once per step, from its own minibatches
    for rep in many.replicas:
        tracked = [v for k, v in rep.model.state_dict().items() if k.endswith("num_batches_tracked")]
        assert all(int(t) == steps for t in tracked)
    assert all(int(v) == steps * R for k, v in one.model.state_dict().items() if k.endswith("num_batches_tracked"))


def test_replica_shards_are_disjoint_and_cover_the_stream_in_turn():
    seen = []

    class Fetched(Observer):
        def fetched(self, replica, mb, batch):
            seen.append((replica, mb))

    data = make_batches(12, batch=4)
    sim = Simulator(make_model(), "petra", num_batches=4, get_batch=data.__getitem__, batch_size=4, replicas=3)
    sim.observers.append(Fetched())
    sim.run()
    assert sorted(mb for _, mb in seen) == list(range(12))
    assert all(mb % 3 == r for r, mb in seen)
    assert [r.mb for r in sim.head_log] == list(range(12))


@pytest.mark.parametrize("method", ["petra", "delayed", "dsp"])
def test_dp_replicas_stay_identical_under_a_pipelined_method(method):
    data = make_batches(16, batch=4)
    sim = Simulator(
        make_model(), method, num_batches=8, get_batch=data.__getitem__, batch_size=4, replicas=2, recipe=LR
    ).run()
    a, b = (weights(rep.model) for rep in sim.replicas)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], v) for k, v in weights(make_model()).items())


def test_one_replica_is_the_plain_pipeline():
    data = make_batches(6, batch=4)
    plain = Simulator(make_model(), "petra", num_batches=6, get_batch=data.__getitem__, batch_size=4).run()
    meshed = Simulator(
        make_model(), "petra", num_batches=6, get_batch=data.__getitem__, batch_size=4, replicas=1, rule="dp"
    ).run()
    assert all(torch.equal(v, meshed.model.state_dict()[k]) for k, v in plain.model.state_dict().items())


def test_rules_by_name():
    assert isinstance(get_rule("dp"), DataParallel) and isinstance(get_rule(None), DataParallel)
    assert "dp" in REPLICA_RULES
    with pytest.raises(ValueError, match="unknown replica rule 'cdp9'; allowed: dp"):
        get_rule("cdp9")
    with pytest.raises(ValueError, match="replicas must be an integer >= 1, got 0"):
        Simulator(
            make_model(),
            "backprop",
            num_batches=2,
            get_batch=make_batches(2, torch.float64, batch=4).__getitem__,
            batch_size=4,
            replicas=0,
        )


def test_a_pipeline_is_freed_on_del():
    import gc
    import weakref

    data = make_batches(4, batch=4)
    sim = Simulator(make_model(), "petra", num_batches=2, get_batch=data.__getitem__, batch_size=4, replicas=2).run(3)
    refs = [weakref.ref(sim), weakref.ref(sim.world), weakref.ref(sim.model)]
    gc.disable()
    try:
        del sim
        assert [r() for r in refs] == [None, None, None], "a reference cycle keeps the pipeline alive"
    finally:
        gc.enable()


def test_observers_see_every_phase_in_order():
    from petra_core.engine.observers import PHASES

    seen = []

    class Log(Observer):
        def before(self, phase, worker, mb):
            seen.append(("before", phase, worker.index))

        def after(self, phase, worker, mb):
            seen.append(("after", phase, worker.index))

    data = make_batches(2, dtype=torch.float32, batch=4)
    sim = Simulator(
        make_model(dtype=torch.float32), "backprop", num_batches=2, get_batch=data.__getitem__, batch_size=4
    )
    sim.observers.append(Log())
    sim.run()
    assert {p for _, p, _ in seen} == set(PHASES)
    stage1 = [(when, p) for when, p, j in seen if j == 1][:8]
    assert stage1 == [
        ("before", "forward"),
        ("after", "forward"),
        ("before", "send"),
        ("after", "send"),
        ("before", "rebuild"),
        ("after", "rebuild"),
        ("before", "backward"),
        ("after", "backward"),
    ]


def test_restored_messages_go_to_the_receiving_stages_device():
    """A checkpoint is read onto the CPU; a restored message must not stay there (an NCCL rank would
    pass its labels on from the CPU)."""
    from petra_core.engine.messages import ForwardMsg
    from petra_core.engine.worlds import LocalWorld

    source = LocalWorld()
    source.connect([range(0, 4)])
    source.transport.send_forward(0, 1, ForwardMsg(3, torch.ones(2, 3), torch.tensor([1, 2])))
    state = source.transport.state_dict()
    world = LocalWorld(devices=[torch.device("meta")])
    world.connect([range(0, 4)])
    world.transport.load_state_dict(state)
    msg = world.transport.recv_forward(0, 2)
    assert msg.mb == 3 and msg.activation.device.type == "meta" and msg.labels.device.type == "meta"


# ---- declarations: what a rule takes and needs is read from its class --------------------------------
@dataclass(frozen=True)
class LateStartOptions(RuleOptions):
    skip: int = 1  # the first optimizer steps that change nothing

    def check(self) -> None:
        if self.skip < 0:
            raise ValueError(f"skip={self.skip!r} is not allowed; allowed: an integer >= 0")


class LateStart(ReplicaRule):
    """A toy rule declared here: each replica trains alone, but leaves its first ``skip`` updates out."""

    name = "toy-late-start"
    Options = LateStartOptions
    needs_replicas = True

    def complete(self, copy, group) -> bool:
        return copy.steps >= self.options.skip


@pytest.fixture
def late_start():
    register_rule(LateStart)
    yield LateStart
    REPLICA_RULES.pop(LateStart.name)


def test_a_rule_declared_outside_the_registry_works_once_registered(late_start):
    data = make_batches(8, batch=4)

    def run(rule, **options):
        return Simulator(
            make_model(),
            "backprop",
            num_batches=4,
            get_batch=data.__getitem__,
            batch_size=4,
            replicas=2,
            rule=get_rule(rule, options=options),
        ).run()

    never = run("toy-late-start", skip=4)  # every step left out: the weights stay where they began
    assert all(torch.equal(v, weights(never.model)[k]) for k, v in weights(make_model()).items())
    alone, independent = run("toy-late-start", skip=0), run("independent")
    for a, b in zip(alone.replicas, independent.replicas):
        assert all(torch.equal(v, weights(b.model)[k]) for k, v in weights(a.model).items())
    cfg = RunConfig.from_dict({"replicas": 2, "replica_rule": "toy-late-start", "rule_options": {"skip": 2}})
    assert cfg.replica_rule == "toy-late-start"


def test_an_undeclared_or_invalid_rule_option_is_refused_with_one_line(late_start):
    for name, options, needle in (
        ("toy-late-start", {"skipp": 1}, "replica rule 'toy-late-start' has no option 'skipp'; allowed: skip"),
        ("toy-late-start", {"skip": -1}, "toy-late-start: skip=-1 is not allowed; allowed: an integer >= 0"),
        ("toy-late-start", {"skip": 1.5}, "toy-late-start: skip=1.5 is not allowed; allowed: an integer"),
        ("dp", {"p": 0.1}, "replica rule 'dp' has no option 'p'; allowed: none"),
        ("wash", {"seed": 3}, "replica rule 'wash' has no option 'seed'"),  # the run's seed is not an option
        ("wash", {"momentum": 1}, "wash: momentum=1 is not allowed; allowed: true or false"),
    ):
        with pytest.raises(ValueError) as err:
            get_rule(name, options=options)
        assert needle in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"replicas": 2, "replica_rule": "toy-late-start", "rule_options": {"skipp": 1}})
    assert "has no option 'skipp'" in str(err.value) and "\n" not in str(err.value)


def test_a_declaration_that_cannot_hold_is_refused_at_registration():
    class Nameless(ReplicaRule):
        pass

    class Taken(ReplicaRule):
        name = "dp"

    class BadInit(ReplicaRule):
        name = "toy-bad-init"
        init = "random"

    for rule, needle in (
        (Nameless, "declares no name of its own"),
        (Taken, "replica rule name 'dp' is taken"),
        (BadInit, "init='random' is not allowed; allowed: same, different"),
    ):
        with pytest.raises(ValueError, match=needle):
            register_rule(rule)
        assert rule not in REPLICA_RULES.values()


NEEDS_REPLICAS = {"cdp1", "cdp2", "independent", "papa", "wash"}  # meaningless with one replica


@pytest.mark.parametrize("name", sorted(REPLICA_RULES))
def test_a_rule_that_needs_replicas_is_refused_with_one_replica(name):
    assert REPLICA_RULES[name].needs_replicas == (name in NEEDS_REPLICAS)
    data = make_batches(4, batch=4)
    k = 2 if name == "acco" else 1

    def build(replicas: int):
        return Simulator(
            make_model(),
            "backprop",
            num_batches=2,
            get_batch=data.__getitem__,
            batch_size=4,
            k=k,
            replicas=replicas,
            rule=name,
        )

    config = {"replicas": 1, "replica_rule": name, "method": "backprop", "k": k}
    if name in NEEDS_REPLICAS:
        with pytest.raises(ValueError) as err:
            build(1)
        assert f"replica rule {name!r} is meaningless with replicas=1" in str(err.value)
        with pytest.raises(ConfigError) as err:
            RunConfig.from_dict(config)
        assert f"replica_rule={name!r} is meaningless with replicas=1" in str(err.value)
        assert "\n" not in str(err.value)
    else:  # dp, and the sharded rules: one worker's update (zero1: the plain optimizer)
        build(1)
        RunConfig.from_dict(config)
    build(2)
    RunConfig.from_dict({**config, "replicas": 2})


def test_a_rule_on_a_schedule_it_does_not_declare_is_refused_by_the_config():
    assert REPLICA_RULES["acco"].schedules == (Sequential,)
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"replicas": 2, "replica_rule": "acco", "method": "petra", "k": 2})
    assert "replica_rule='acco' with method='petra', k=2: replica rule 'acco' runs on the sequential" in str(err.value)
    with pytest.raises(ConfigError, match="needs k >= 2"):
        RunConfig.from_dict({"replicas": 2, "replica_rule": "acco", "method": "backprop", "k": 1})
