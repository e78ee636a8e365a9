"""Oracles for the methods run through the one stage algorithm (issue: methods + simulator)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import BeforeStep, batches_tracked, make_batches, make_model, resumed

from petra_core import METHODS, Pipeline, Recipe, Simulator, simulate
from petra_core.batchnorm import frozen_running_stats
from petra_core.engine import LocalWorld, PipelineSpec
from petra_core.engine.observers import Observer
from petra_core.methods import Reconstruct
from petra_core.models import streams

PAPER_METHODS = [name for name, m in METHODS.items() if not m.needs_aux]  # local learning: tests/test_local.py
LR0 = Recipe(base_lr=0.0, weight_decay=5e-4, scale_lr=False)
LR = Recipe(base_lr=0.05, weight_decay=5e-4, scale_lr=False)


def stage_grads(module):
    return torch.cat([p.grad.flatten() for p in module.parameters()])


def rel_err(a, b):
    return float((a - b).norm() / b.norm())


def summed_step_grads(sim):
    """Sum over the run of each stage's accumulated gradient, captured just before each step."""
    sums = [None] * len(sim.workers)

    def hook(worker):
        g = stage_grads(worker.stage).clone()
        sums[worker.index] = g if sums[worker.index] is None else sums[worker.index] + g

    sim.observers.append(BeforeStep(hook))
    return sums


@pytest.mark.parametrize("method", PAPER_METHODS)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_zero_staleness_oracle(method, dtype, tol):
    """With lr = 0 every method accumulates exactly backprop's gradients, at every stage."""
    n, k = 6, 2
    batches = make_batches(n, dtype)
    model = make_model(dtype=dtype)
    reference = copy.deepcopy(model)
    for x, y in batches:
        (F.cross_entropy(reference(x), y) / k).backward()

    sim = Simulator(model, method, num_batches=n, get_batch=batches.__getitem__, batch_size=6, k=k, recipe=LR0)
    sums = summed_step_grads(sim)
    sim.run()
    for j, stage in enumerate(reference):
        err = rel_err(sums[j], stage_grads(stage))
        assert err < tol, f"{method} stage {j} ({stage.kind}): relative gradient error {err:.2e}"
    # the same running statistics as backprop, each stage updated once per minibatch
    for (name, a), b in zip(model.named_buffers(), reference.buffers()):
        if a.is_floating_point():
            assert rel_err(a, b) < tol * 10, f"{method}: buffer {name}"
        else:
            assert torch.equal(a, b), f"{method}: buffer {name}"


@pytest.mark.parametrize("method", ["backprop", "delayed", "dsp"])
def test_zero_staleness_oracle_on_resnet(method):
    n, k = 4, 1
    batches = make_batches(n, torch.float64)
    model = make_model("resnet18", torch.float64)
    reference = copy.deepcopy(model)
    for x, y in batches:
        F.cross_entropy(reference(x), y).backward()
    sim = Simulator(model, method, num_batches=n, get_batch=batches.__getitem__, batch_size=6, k=k, recipe=LR0)
    sums = summed_step_grads(sim)
    sim.run()
    for j, stage in enumerate(reference):
        assert rel_err(sums[j], stage_grads(stage)) < 1e-10


def test_stash_oracle_delayed_gradients_use_the_forward_weights():
    """Delayed gradients = autograd on the network holding the weight versions of each forward."""
    n, dtype = 22, torch.float64  # > 2(J-1): stage 0 sees weights move between forward and backward
    batches = make_batches(n, dtype, size=8)
    model = make_model(dtype=dtype)
    sim = Simulator(model, "delayed", num_batches=n, get_batch=batches.__getitem__, batch_size=6, k=1, recipe=LR)
    used = {}  # (stage, mb) -> weights used in the forward
    grads = {}  # (stage, mb) -> gradient delivered for that minibatch (k = 1: one step per minibatch)
    for w in sim.workers:
        forward = w.forward

        def recording_forward(msg, *args, w=w, forward=forward):
            used[w.index, msg.mb] = copy.deepcopy(w.stage.state_dict())
            return forward(msg, *args)

        w.forward = recording_forward
    sim.observers.append(BeforeStep(lambda w: grads.__setitem__((w.index, w.steps), stage_grads(w.stage).clone())))
    sim.run()
    assert any(w.steps > 0 for w in sim.workers)
    for mb in range(n):
        net = copy.deepcopy(model)
        for j, stage in enumerate(net):
            stage.load_state_dict(used[j, mb])
        x, y = batches[mb]
        F.cross_entropy(net(x), y).backward()
        for j, stage in enumerate(net):
            assert rel_err(grads[j, mb], stage_grads(stage)) < 1e-10, f"minibatch {mb}, stage {j}"
    # weights really moved between forwards (otherwise the oracle would be vacuous)
    assert not torch.equal(used[0, n - 1]["body.0.weight"], used[0, 0]["body.0.weight"])


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_reversible_backprop_equals_backprop_while_training(dtype, tol):
    batches = make_batches(6, dtype)
    runs = {}
    for method in ("backprop", "revbackprop"):
        model = make_model(dtype=dtype)
        sim = simulate(model, method, batches, k=1, recipe=LR)
        runs[method] = (model, [loss for _, loss, _, _ in sim.head_log])
    (m_bp, loss_bp), (m_rev, loss_rev) = runs["backprop"], runs["revbackprop"]
    assert loss_bp == pytest.approx(loss_rev, rel=tol)
    for (name, a), b in zip(m_rev.state_dict().items(), m_bp.state_dict().values()):
        if a.is_floating_point():
            assert rel_err(a, b) < tol, name
    assert not torch.equal(m_bp[1].F[0][0].weight, make_model(dtype=dtype)[1].F[0][0].weight)  # it trained


@pytest.mark.parametrize("recipe,exact", [(LR0, True), (LR, False)])
def test_petra_reconstruction(recipe, exact):
    """A reversible stage's rebuilt input = inverse of what it received, under its current weights;
    with lr = 0 it is the true input of that minibatch."""
    n, dtype = 6, torch.float64
    batches = make_batches(n, dtype)
    model = make_model(dtype=dtype)
    sim = Simulator(model, "petra", num_batches=n, get_batch=batches.__getitem__, batch_size=6, k=1, recipe=recipe)
    true_inputs, checked = {}, []
    for w in sim.workers:
        if not isinstance(w.storage, Reconstruct):
            continue
        forward, local_graph = w.forward, w.storage.local_graph

        def recording_forward(msg, *args, w=w, forward=forward):
            true_inputs[w.index, msg.mb] = streams.join(msg.activation).clone()
            return forward(msg, *args)

        def checking_local_graph(stage, mb, output, *, input_grad, w=w, local_graph=local_graph):
            with frozen_running_stats(stage):
                expected = stage.inverse(output)
            graph = local_graph(stage, mb, output, input_grad=input_grad)
            torch.testing.assert_close(graph.input_value(), expected, rtol=1e-12, atol=1e-12)
            err = rel_err(streams.join(graph.input_value()), true_inputs[w.index, mb])
            checked.append(err)
            if exact:
                assert err < 1e-12
            return graph

        w.forward, w.storage.local_graph = recording_forward, checking_local_graph
    sim.run()
    assert len(checked) == n * len(model.reversible_stages)
    if not exact:
        assert max(checked) > 1e-10  # weights moved: the reconstruction is approximate, as in the paper


@pytest.mark.parametrize("method", METHODS)
def test_batchnorm_statistics_updated_once_per_minibatch(method):
    n = 5
    model = make_model(method=method)
    simulate(model, method, make_batches(n), k=2, recipe=LR)
    assert set(batches_tracked(model)) == {n}


@pytest.mark.parametrize("method", ["delayed", "dsp", "petra"])
def test_buffering_stages_hold_2_J_minus_1_minus_j_entries_at_steady_state(method):
    n = 30
    batches = make_batches(n, size=8)
    model = make_model()
    J = len(model)
    sim = Simulator(model, method, num_batches=n, get_batch=batches.__getitem__, batch_size=6, k=1, recipe=LR)
    saw_steady = False
    while not sim.done:
        sim.advance()
        if 2 * (J - 1) <= sim.tick - 1 < n:  # every stage busy in both directions
            saw_steady = True
            for w in sim.workers:
                buffering = not isinstance(w.storage, Reconstruct)
                assert w.storage.in_flight() == 2 * (J - 1 - w.index), (w.index, w.storage.name)
                kept = sum(w.storage.kept_bytes().values())
                assert (kept > 0) == (buffering and w.index < J - 1), (w.index, kept)
    assert saw_steady
    assert all(w.storage.in_flight() == 0 and sum(w.storage.kept_bytes().values()) == 0 for w in sim.workers)


def test_kept_bytes_per_method():
    """PETRA's reversible stages keep nothing; DSP keeps inputs; delayed keeps graph + weight stash."""
    n = 40  # stage 0 (delay 18) reaches a steady state where all 19 in-flight weight versions differ
    batches = make_batches(n, size=8)
    peaks = {}
    for method in ("delayed", "dsp", "petra"):
        model = make_model()
        sim = simulate(model, method, batches, k=1, recipe=LR)
        peaks[method] = [w.peak_kept for w in sim.workers]
    J = len(model)
    x_bytes = 6 * 3 * 8 * 8 * 4
    for j, stage in enumerate(model):
        if j == J - 1:
            continue
        if stage.reversible:
            assert sum(peaks["petra"][j].values()) == 0
        # DSP buffers inputs: (2(J-1-j) + 1 while the forward of the newest is done) of them
        expected_entries = 2 * (J - 1 - j) + 1
        if j == 0:
            assert peaks["dsp"][0]["input"] == expected_entries * x_bytes
        assert peaks["delayed"][j]["weight_stash"] > 0 and peaks["delayed"][j]["graph"] > peaks["dsp"][j]["input"]
    param_bytes = sum(p.numel() * 4 for p in model[0].parameters())
    assert peaks["delayed"][0]["weight_stash"] == (2 * (J - 1) + 1) * param_bytes


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(method="sgd"), "unknown method 'sgd'; allowed: backprop, revbackprop, delayed, dsp, petra"),
        (dict(method="petra", k=0), "accumulation k must be an integer >= 1, got 0"),
        (dict(method="petra", arch="resnet18"), "'petra' needs reversible stages"),
        (dict(method="revbackprop", arch="resnet18"), "one of: backprop, delayed, dsp"),
    ],
)
def test_bad_method_arguments(kwargs, needle):
    model = make_model(kwargs.pop("arch", "revnet18"))
    with pytest.raises(ValueError) as err:
        simulate(model, kwargs.pop("method"), make_batches(2), **kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("method,replicas", [(m, 1) for m in METHODS] + [("petra", 2), ("backprop", 2)])
def test_every_method_runs_a_whole_schedule_on_the_meta_device(method, replicas):
    """No host sync in a tick: on the meta device every read of a value (.item(), .tolist(),
    bool(tensor)) raises, so a whole schedule (fill, steady state, steps through the replica
    rule, the final drain) that completes on meta never waited for a device."""
    from petra_core import Pipeline
    from petra_core.engine import LocalWorld, PipelineSpec

    model = make_model(method=method)
    x = torch.empty(2, 3, 16, 16, device="meta")
    y = torch.empty(2, dtype=torch.long, device="meta")
    # past the fill, into the steady state (where weights move in flight)
    n = 2 if METHODS[method].schedule.fixed_weights_in_flight else 2 * len(model)
    pipe = Pipeline.build(
        PipelineSpec(
            model=model,
            method=method,
            world=LocalWorld(devices=[torch.device("meta")], replicas=replicas),
            num_batches=n,
            get_batch=lambda mb: (x, y),
            batch_size=2,
            k=2,
            recipe=LR,
        )
    )
    pipe.run()
    assert pipe.done and all(w.steps == n // 2 for rep in pipe.replicas for w in rep.workers)
    assert next(pipe.model.parameters()).device.type == "meta"


@pytest.mark.parametrize("method,k", [("backprop", 1), ("backprop", 2), ("revbackprop", 2)])
def test_sequential_steps_deferred_to_the_periods_end_give_the_same_bits(method, k):
    """One replica in a sequential schedule steps every stage at the period's last tick, not right
    after its backward: no weight is read in between, so the bits are those of stepping at once."""
    n = 5  # an odd count: the last accumulation group is partial
    batches = make_batches(n)
    runs = []
    for defer in (True, False):
        model = make_model()
        sim = Simulator(model, method, num_batches=n, get_batch=batches.__getitem__, batch_size=6, k=k, recipe=LR)
        assert sim.defer_steps
        sim.defer_steps = defer
        sim.run(ticks=sim.schedule.period + len(model) + 2)  # three backwards into the second period:
        assert len(sim.deferred) == (3 if defer else 0)  # reading the weights takes their steps
        mid = {name: t.clone() for name, t in sim.gather_state_dict().items()}
        sim.run()
        runs.append((mid, model.state_dict(), [r.loss for r in sim.head_log]))
    (mid_a, end_a, loss_a), (mid_b, end_b, loss_b) = runs
    assert loss_a == loss_b
    for state_a, state_b in ((mid_a, mid_b), (end_a, end_b)):
        assert all(torch.equal(state_a[name], state_b[name]) for name in state_a)


def _train(method, arch, n, k, *, observe=False, precision="fp32", channels_last=False, interrupt_at=None):
    """A pipeline of ``method`` trained on ``n`` minibatches: (model state, losses, joins). With
    ``interrupt_at``, saved at that tick and resumed on a fresh model and pipeline, as a run does."""
    model, batches = make_model(arch), make_batches(n)
    if channels_last:  # as a run does by default: gradients then come back in more than one layout
        model = model.to(memory_format=torch.channels_last)
        batches = [(x.contiguous(memory_format=torch.channels_last), y) for x, y in batches]

    def pipeline(model):
        pipe = Pipeline.build(
            PipelineSpec(
                model=model,
                method=method,
                world=LocalWorld(),
                num_batches=n,
                get_batch=batches.__getitem__,
                batch_size=6,
                k=k,
                recipe=LR,
                precision=precision,
            )
        )
        if observe:
            pipe.observers.append(Observer())
        return pipe

    pipe = pipeline(model)
    if interrupt_at is not None:
        model, pipe = resumed(pipe, model, interrupt_at, lambda: make_model(arch, seed=1), pipeline)
    pipe.run()
    return model.state_dict(), [r.loss for r in pipe.head_log], [w.joins_next for w in pipe.workers]


def _same_bits(a, b):
    return a[1] == b[1] and all(torch.equal(a[0][name], b[0][name]) for name in a[0])


@pytest.mark.parametrize(
    "arch,k,precision,channels_last",
    [
        ("revnet18", 1, "fp32", False),
        ("revnet18", 2, "fp32", True),
        ("resnet18", 2, "fp32", True),
        ("resnet18", 1, "fp32", False),
        ("revnet18", 1, "bf16", True),
    ],
)
def test_joined_graphs_give_the_bits_of_a_graph_per_stage(arch, k, precision, channels_last):
    """Backprop in one process joins every stage's graph to the next one's (one autograd call per
    minibatch); an observer keeps them apart (it times each stage's own backward). Same bits, also
    in channels-last, where a gradient crossing a stage boundary must keep the activation's layout
    (``streams.attached``)."""
    n = 5  # the last accumulation group is partial
    joined = _train("backprop", arch, n, k, precision=precision, channels_last=channels_last)
    apart = _train("backprop", arch, n, k, precision=precision, channels_last=channels_last, observe=True)
    assert joined[2] == [True] * (len(joined[2]) - 1) + [False]  # every stage but the head joins the next
    assert _same_bits(joined, apart)


@pytest.mark.parametrize("method", ["delayed", "petra", "revbackprop", "local", "gpipe", "1f1b"])
def test_only_graphs_of_the_live_weights_under_a_sequential_schedule_join(method):
    model = make_model(method=method)
    pipe = Pipeline.build(
        PipelineSpec(
            model=model,
            method=method,
            world=LocalWorld(),
            num_batches=1,
            get_batch=make_batches(1).__getitem__,
            batch_size=6,
            recipe=LR,
        )
    )
    expected = [
        METHODS[method].schedule.one_in_flight and w.storage.joins and b.storage.joins
        for w, b in zip(pipe.workers, pipe.workers[1:])
    ]
    assert [w.joins_next for w in pipe.workers] == expected + [False]
    assert not any(expected), method  # backprop alone keeps live graphs with one minibatch in flight


def test_a_joined_pipeline_saved_at_any_tick_of_a_period_resumes_to_the_same_bits():
    """Saved mid-period, a joined graph is not saved (in-flight messages and records lose their
    graph); the resumed stages backpropagate their own graphs and reach the same bits."""
    n, k = 3, 2
    whole = _train("backprop", "revnet18", n, k)
    period = 2 * len(make_model()) - 1
    for tick in range(period, 2 * period + 1):  # every tick of the second minibatch's period
        assert _same_bits(_train("backprop", "revnet18", n, k, interrupt_at=tick), whole), tick


@pytest.mark.parametrize("method", ["gpipe", "1f1b"])
@pytest.mark.parametrize("arch", ["revnet18", "resnet18"])
@pytest.mark.parametrize("k", [2, 3])
def test_synchronous_pipelines_train_as_backprop_bit_for_bit(method, arch, k):
    """GPipe and 1F1B (backprop's storage, k microbatches a flush) give backprop's weights, batch-norm
    statistics and losses bit for bit: no weight moves in flight and each stage runs its backwards
    in forward order, so every gradient accumulates in backprop's order. n = 7: a partial last group."""
    n = 7
    reference = _train("backprop", arch, n, k)
    run = _train(method, arch, n, k)
    assert not any(run[2])  # several minibatches in flight: a graph per stage (assembly.join_graphs)
    assert _same_bits(run, reference), (method, arch, k)
    initial = make_model(arch).state_dict()
    assert not torch.equal(reference[0]["0.body.0.weight"], initial["0.body.0.weight"])  # it trained


@pytest.mark.parametrize("method", ["gpipe", "1f1b"])
def test_a_synchronous_pipeline_saved_at_any_tick_of_a_group_resumes_to_the_same_bits(method):
    """Saved at every tick (fill, both groups, the partial last one), resumed, the same bits."""
    n, k = 5, 3
    whole = _train(method, "revnet18", n, k)
    assert _same_bits(whole, _train("backprop", "revnet18", n, k))
    schedule = METHODS[method].schedule(len(make_model()), n, k=k)
    for tick in range(schedule.num_ticks):
        assert _same_bits(_train(method, "revnet18", n, k, interrupt_at=tick), whole), tick
