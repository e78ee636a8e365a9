"""Accounting oracles (issue: measuring what the paper only estimated)."""

import copy

import pandas as pd
import pytest
import torch
from conftest import make_batches, make_model

from petra_core import Recipe, Simulator, build_model
from petra_core.accounting import (
    Recorder,
    measure_steady_state,
    per_stage,
    stage_shapes,
    table1,
    table3,
)
from petra_core.engine.fidelity import track_fidelity
from petra_core.engine.observers import Observer
from petra_core.reference import evaluate_formula, load_reference

TINY_PER_STAGE = dict(stem="cifar", image_size=8, batch=2, width=4, num_classes=5, num_batches=2)  # per_stage's setup


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: one intra-op thread is faster and immune to other processes on shared cores.
    Module-scoped (it overrides conftest's per-test one) so that it covers ``tiny_costs`` too."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_costs():
    return per_stage("revnet18", **TINY_PER_STAGE)


# ---- Table 3 ------------------------------------------------------------------------------------
def test_table3_formula_reproduces_the_paper():
    rows = table3()
    by = {(r["accounting"], r["row"]): r for r in rows}
    paper = load_reference("paper_table3")["rows"]
    for i, ref in enumerate(paper, start=1):
        for acc in ("formula", "formula_conv_bias"):  # our param count and the authors' round alike
            assert round(by[acc, i]["memory_gb"], 1) == ref["memory_gb"], (acc, i)
            assert round(by[acc, i]["saving_pct"], 1) == ref["saving_pct"], (acc, i)
        assert round(by["formula", i]["memory_gb"], 2) == ref["formula_rerun_gb"]
        # real shapes: a reversible stage's input is both streams -> rows 1-2 grow by ~22 GB
        assert by["real", i]["memory_gb"] > by["formula", i]["memory_gb"]
    assert 21 < by["real", 1]["memory_gb"] - by["formula", 1]["memory_gb"] < 24
    assert 66 < by["real", 4]["saving_pct"] < 70


def test_parameter_counts_from_shape_propagation():
    with torch.device("meta"):
        model = build_model("revnet50", num_classes=1000, stem="imagenet")
    rows = stage_shapes(model, batch=64, image_size=224)
    assert sum(r["params"] for r in rows) == 30_391_144
    assert sum(r["params_with_conv_bias"] for r in rows) == 30_421_608  # the authors' count
    assert [r["kind"] for r in rows] == model.kinds.split()
    assert rows[2]["input_shape"] == (64, 512, 56, 56) and rows[2]["input_numel_paper"] == 64 * 256 * 56 * 56


# ---- memory: prediction = reality ---------------------------------------------------------------
@pytest.mark.parametrize("method", ["dsp", "petra", "delayed"])
def test_kept_bytes_prediction_equals_held_tensors(method):
    """Per stage, at a steady-state tick: predicted buffers = distinct storages the policies hold
    (exact); whole process: the allocator agrees with the prediction (within 5 %)."""
    torch.manual_seed(0)
    model = build_model("revnet18", num_classes=10, width=4)
    r = measure_steady_state(model, method, batch=4, image_size=8)
    held, predicted = {}, {}
    for h in r["held_by_stage"]:
        held[h["stage"], h["buffer"]] = h["held_bytes"]
        if h["buffer"] == "input":  # the policy's own report is right for buffered inputs
            assert h["reported_bytes"] == h["held_bytes"]
    names = {"input_buffer": "input", "weight_stash": "weight_stash"}
    for p in r["predicted"]:
        if p["component"] in names:
            predicted[p["stage"], names[p["component"]]] = p["bytes"]
    for key, n in predicted.items():
        assert held.get(key, 0) == n, key
    if method == "petra":  # reversible stages hold nothing at all
        assert all(n == 0 for (j, _), n in held.items() if model[j].reversible)
    if r["predicted_bytes"] is not None:
        assert r["allocated_bytes"] == pytest.approx(r["predicted_bytes"], rel=0.05)
    else:  # kept graphs: compare with what the policies really hold instead
        assert r["allocated_bytes"] >= r["held_bytes"] > 0


# ---- communication ------------------------------------------------------------------------------
def test_petra_communication_factors(tiny_costs):
    """vs the ResNet of the same stream width: forward ×2; a reversible stage receives ×4 (activation
    + gradient, both two streams) and sends ×4 back when its predecessor also rebuilds."""
    df = tiny_costs[tiny_costs.method == "petra"].set_index("stage")
    kinds = df.kind.tolist()
    for j, r in df.iterrows():
        if r.kind == "H":
            continue
        assert r.fwd_sent_vs_resnet == 2
        if r.kind == "R":
            assert r.bwd_received_vs_resnet == 4
            assert r.bwd_sent_vs_resnet == (4 if kinds[j - 1] == "R" else 2)
    bp = tiny_costs[tiny_costs.method == "backprop"]
    assert (bp.bwd_sent_vs_resnet.dropna() == 2).all()  # a RevNet activation is two ResNet streams


# ---- FLOPs ----------------------------------------------------------------------------------------
def test_flop_ratios(tiny_costs):
    df = tiny_costs.set_index(["method", "stage"])
    for j in df.loc["petra"].index:
        r = df.loc[("petra", j)]
        if r.kind == "R":  # rebuild builds the graph: 1 forward + 1 backward, not 2 forwards + backward
            assert r.rebuild_flops == r.forward_flops and r.backward_flops == 2 * r.forward_flops
        if r.kind == "D":  # recomputation from the buffered input: same cost
            assert r.rebuild_flops == r.forward_flops
    for j in df.loc["delayed"].index:
        assert df.loc[("delayed", j)].rebuild_flops == 0
    total = (
        (tiny_costs.forward_flops + tiny_costs.rebuild_flops + tiny_costs.backward_flops)
        .groupby(tiny_costs.method)
        .sum()
    )
    fwd = df.loc["backprop"].forward_flops
    # backward = 2 forwards, except the stem, which needs no input gradient (1 forward)
    assert total["backprop"] == 3 * fwd.sum() - fwd.iloc[0] == total["delayed"]
    assert total["petra"] == total["dsp"] == total["revbackprop"] == total["backprop"] + fwd.iloc[:-1].sum()
    rows = {(r["method"], r["quantity"]): r for r in table1(tiny_costs)}
    J = rows["petra", "flops"]["J"]
    assert rows["backprop", "flops"]["measured"] == pytest.approx(3 * J, rel=0.05)  # the paper's 3J
    assert rows["petra", "flops"]["measured"] == pytest.approx(4 * J, rel=0.05)  # the paper's 4J


def test_table1_storage_columns(tiny_costs):
    rows = {(r["method"], r["quantity"]): r for r in table1(tiny_costs)}
    J, j = rows["petra", "flops"]["J"], rows["petra", "flops"]["j"]
    assert rows["petra", "activations"]["measured"] == 0
    assert rows["dsp", "activations"]["measured"] == rows["dsp", "activations"]["paper"] == 2 * (J - j)
    assert rows["delayed", "params"]["measured"] == 1 + 2 * (J - j)  # live weights + one stash per version
    assert rows["delayed", "activations"]["measured"] == pytest.approx(rows["delayed", "activations"]["paper"])
    assert rows["petra", "comm"]["measured"] == rows["petra", "comm"]["paper"] == 4


# ---- the recorder observes, never steers ---------------------------------------------------------
def test_recorder_does_not_change_training():
    batches = make_batches(6, size=8)
    states = []
    for record in (False, True):
        model = make_model()
        sim = Simulator(
            model,
            "petra",
            num_batches=6,
            get_batch=batches.__getitem__,
            batch_size=6,
            k=2,
            recipe=Recipe(base_lr=0.05, scale_lr=False),
        )
        if record:
            rec = Recorder(sim, flops_minibatches={0}, walk_held=True)
        sim.run()
        states.append((copy.deepcopy(model.state_dict()), [loss for _, loss, _, _ in sim.head_log]))
    assert states[0][1] == states[1][1]
    for a, b in zip(states[0][0].values(), states[1][0].values()):
        assert torch.equal(a, b)
    assert {p["phase"] for p in rec.phases} >= {"forward", "rebuild", "backward", "step"}
    steps = [p for p in rec.phases if p["phase"] == "step"]
    # k = 2: the step closes the group of minibatches 2g, 2g + 1, at the end of the last one's backward tick
    backward_ticks = {(p["stage"], p["mb"]): p["tick"] for p in rec.phases if p["phase"] == "backward"}
    assert len(steps) == 3 * len(model) and all(p["mb"] % 2 == 1 for p in steps)
    assert all(p["tick"] == backward_ticks[p["stage"], p["mb"]] for p in steps)
    assert all(p["flops_counted"] == (p["mb"] == 0 and p["phase"] != "step") for p in rec.phases)
    assert {(m["direction"], m["stage"] - m["receiver"]) for m in rec.messages} == {("forward", -1), ("backward", 1)}
    assert rec.kept and {k["mb"] for k in rec.kept} == set(range(6))
    rec.detach()
    assert rec not in sim.observers
    for w in sim.workers:  # observed through the runner's hooks, nothing patched
        assert not {"forward", "rebuild", "backward", "step"} & set(vars(w))
        assert "local_graph" not in vars(w.storage)


# ---- gradient fidelity -----------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["delayed", "dsp", "petra"])
def test_fidelity_is_exact_with_zero_learning_rate(method):
    n, k = 8, 2
    batches = make_batches(n, size=8)
    model = make_model()
    sim = Simulator(
        model,
        method,
        num_batches=n,
        get_batch=batches.__getitem__,
        batch_size=6,
        k=k,
        recipe=Recipe(base_lr=0.0, scale_lr=False),
    )
    tracker = track_fidelity(sim, every=3)
    sim.run()
    records = tracker.records
    assert sorted({r["step"] for r in records}) == [0, 3]
    assert len(records) == 2 * len(model)
    for r in records:
        assert r["cosine"] == pytest.approx(1.0, abs=1e-6) and r["rel_error"] < 1e-5, r
        # weights fixed: a rebuilt input is the forward's to rounding; a kept input or graph, exactly
        rebuilds = method == "petra" and model[r["stage"]].reversible and r["stage"] < len(model) - 1
        assert r["input_error"] < 1e-5 if rebuilds else r["input_error"] == 0.0, r
    assert not tracker._batches  # cached minibatches are freed once every stage used them
    assert not tracker._received and not tracker._handed and not tracker._input_errors  # nor the inputs compared
    tracker.detach()
    assert tracker not in sim.observers


@pytest.mark.parametrize("method", ["delayed", "dsp", "petra"])
def test_fidelity_keeps_inputs_only_of_the_stages_that_rebuild_them(method):
    """A stage that keeps its input or graph computes at the exact input: nothing to keep for it."""
    batches = make_batches(4, size=8)
    model = make_model()
    sim = Simulator(model, method, num_batches=4, get_batch=batches.__getitem__, batch_size=6, k=1)
    tracker = track_fidelity(sim, every=1)
    held: set[int] = set()  # the stages whose forward inputs the tracker holds, seen after every send

    class Spy(Observer):
        def sent(self, worker, direction, msg):
            held.update(j for j, _ in (*tracker._received, *tracker._handed))

    sim.observers.append(Spy())
    sim.run()
    rebuilders = {w.index for w in sim.workers if w.storage.needs_output_back and not w.storage.keeps}
    assert held == rebuilders and (method == "petra") == bool(held)


def test_fidelity_of_replicas_is_exact_with_zero_learning_rate():
    """Two dp replicas: the stepped gradient is the mean over both replicas' minibatches of the group."""
    n, k = 8, 2
    batches = make_batches(2 * n, size=8)
    model = make_model()
    sim = Simulator(
        model,
        "petra",
        num_batches=n,
        get_batch=batches.__getitem__,
        batch_size=6,
        k=k,
        recipe=Recipe(base_lr=0.0, scale_lr=False),
        replicas=2,
    )
    tracker = track_fidelity(sim, every=3)
    sim.run()
    assert len(tracker.records) == 2 * len(model)
    for r in tracker.records:
        assert r["num_minibatches"] == 2 * k
        assert r["cosine"] == pytest.approx(1.0, abs=1e-6) and r["rel_error"] < 1e-5, r
    assert not tracker._batches


def test_fidelity_sees_staleness():
    n = 22
    batches = make_batches(n, batch=4, size=4)
    model = make_model()
    sim = Simulator(
        model,
        "petra",
        num_batches=n,
        get_batch=batches.__getitem__,
        batch_size=6,
        k=1,
        recipe=Recipe(base_lr=0.05, scale_lr=False),
    )
    tracker = track_fidelity(sim, every=20)
    sim.run()
    first = [r for r in tracker.records if r["step"] == 0]
    late = [r for r in tracker.records if r["step"] == 20]
    # the head's first step: nothing upstream has moved yet, so it is exact; later, stale stages differ
    assert next(r for r in first if r["kind"] == "H")["rel_error"] < 1e-5
    assert max(r["rel_error"] for r in late) > 1e-3 and min(r["cosine"] for r in late) < 0.999
    # the head computes at its input as it got it; a reversible stage rebuilds it with moved weights
    assert next(r for r in late if r["kind"] == "H")["input_error"] == 0.0
    assert min(r["input_error"] for r in late if r["kind"] == "R") > 1e-4


# ---- reference data -----------------------------------------------------------------------------
def test_paper_table1_is_data():
    t1 = load_reference("paper_table1")["methods"]
    assert list(t1) == ["backprop", "revbackprop", "delayed", "dsp", "petra"]
    assert evaluate_formula(t1["delayed"]["params"], J=10, j=3, k=2) == 7
    with pytest.raises(ValueError):
        evaluate_formula("__import__('os')", J=1)


def test_table1_times_the_second_half_of_the_minibatches_none_flop_counted():
    """The pipeline's fill (growing memory, page faults on CPU) is left out of the time column."""
    from petra_core.accounting.table1 import steady_phases

    phases = pd.DataFrame(dict(mb=list(range(8)), flops_counted=[True] + [False] * 7, seconds=range(8)))
    assert steady_phases(phases, 8).mb.tolist() == [4, 5, 6, 7]
    assert steady_phases(phases.iloc[:3], 3).mb.tolist() == [1, 2], "few minibatches: every one not counted"
    assert steady_phases(phases.iloc[:1], 1).mb.tolist() == [0], "one minibatch: itself"
