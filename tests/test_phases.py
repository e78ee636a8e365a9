"""Static phases (engine/phases.py) give the bits of eager ones; graphs give those of static (GPU).

The oracle: the same seed, model and minibatches through ``phases="eager"`` and ``"static"``, then
the weights, batch-norm statistics and per-minibatch losses compared bit for bit, with the steady
state's weight updates between a minibatch's forward and its backward, accumulation, a partial
last group, a warm-up schedule, a last partial batch (another shape: unbuffered), bf16 and a
resume mid-run. On a GPU, ``graphs`` against ``static``.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_batches, make_model, resumed

from petra_core import Pipeline, Recipe
from petra_core.engine import LocalWorld, PipelineSpec
from petra_core.engine.phases import PHASES, StaticCall, check_phases, static_methods
from petra_core.methods import METHODS

LR = Recipe(base_lr=0.05, weight_decay=5e-4, scale_lr=False)
WARM = Recipe(base_lr=0.05, weight_decay=5e-4, scale_lr=False, warmup_epochs=1.0, milestones=(1.5,))
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _pipeline(model, batches, method, phases, *, k=1, recipe=LR, precision="fp32", device="cpu"):
    return Pipeline.build(
        PipelineSpec(
            model=model,
            method=method,
            world=LocalWorld(devices=[torch.device(device)]),
            num_batches=len(batches),
            get_batch=batches.__getitem__,
            batch_size=len(batches[0][1]),
            batches_per_epoch=4,
            k=k,
            recipe=recipe,
            precision=precision,
            phases=phases,
        )
    )


def _train(method, phases, *, arch="revnet18", n=9, interrupt_at=None, device="cpu", last_batch=None, **kw):
    """(state, losses, pipeline) of ``method`` trained on ``n`` minibatches (with ``last_batch``,
    the last has that many samples; with ``interrupt_at``, saved at that tick and resumed)."""
    model, batches = make_model(arch).to(device), make_batches(n)
    if last_batch is not None:
        x, y = batches[-1]
        batches[-1] = (x[:last_batch], y[:last_batch])
    batches = [(x.to(device), y.to(device)) for x, y in batches]

    def pipeline(model):
        return _pipeline(model, batches, method, phases, device=device, **kw)

    pipe = pipeline(model)
    if interrupt_at is not None:
        model, pipe = resumed(pipe, model, interrupt_at, lambda: make_model(arch, seed=1).to(device), pipeline)
    pipe.run()
    return {k: v.cpu() for k, v in model.state_dict().items()}, [r.loss for r in pipe.head_log], pipe


def _assert_same_bits(a, b):
    assert a[1] == b[1]  # every minibatch's loss
    different = [name for name in a[0] if not torch.equal(a[0][name], b[0][name])]
    assert not different, f"{len(different)} tensors differ, first {different[0]}"


@pytest.mark.parametrize(
    "method,k,recipe,precision",
    [
        ("petra", 1, LR, "fp32"),
        ("petra", 2, WARM, "fp32"),
        ("dsp", 2, LR, "fp32"),
        ("revbackprop", 1, WARM, "fp32"),
        ("petra", 1, LR, "bf16"),
    ],
)
def test_static_phases_give_the_bits_of_eager_ones(method, k, recipe, precision):
    eager = _train(method, "eager", k=k, recipe=recipe, precision=precision)
    static = _train(method, "static", k=k, recipe=recipe, precision=precision)
    _assert_same_bits(eager, static)
    assert all(w.phases is not None and w.phases.unbuffered == 0 for w in static[2].workers)


def test_static_phases_on_a_resnet_under_dsp_give_the_bits_of_eager_ones():
    _assert_same_bits(_train("dsp", "eager", arch="resnet18", k=2), _train("dsp", "static", arch="resnet18", k=2))


def test_a_last_partial_batch_runs_unbuffered_with_the_same_bits():
    eager = _train("petra", "eager", last_batch=4)
    static = _train("petra", "static", last_batch=4)
    _assert_same_bits(eager, static)
    # the partial minibatch's forward and backward at every stage but the head, which only backward-computes
    assert [w.phases.unbuffered for w in static[2].workers] == [2] * (len(static[2].workers) - 1) + [1]


@pytest.mark.parametrize("interrupt_at", [3, 12])
def test_a_static_run_resumed_mid_run_gives_the_bits_of_an_uninterrupted_one(interrupt_at):
    _assert_same_bits(_train("petra", "eager", k=2), _train("petra", "static", k=2, interrupt_at=interrupt_at))


def test_static_phases_accumulate_into_gradients_allocated_once():
    """Gradients stay the same tensors across steps (a graph reads and writes them in place)."""
    model, batches = make_model(), make_batches(6)
    pipe = _pipeline(model, batches, "petra", "static")
    pipe.run(ticks=len(model) + 1)
    before = [p.grad for p in model.parameters()]
    assert all(g is not None for g in before)
    pipe.run()
    assert all(p.grad is g for p, g in zip(model.parameters(), before))


@pytest.mark.parametrize("method", sorted(set(METHODS) - {"petra", "dsp", "revbackprop"}))
def test_static_phases_refuse_methods_that_keep_graphs_across_ticks_in_one_line(method):
    with pytest.raises(ValueError) as err:
        check_phases("static", METHODS[method], replicas=1)
    assert "phases='eager'" in str(err.value) and "\n" not in str(err.value)
    assert sorted(static_methods()) == ["dsp", "petra", "revbackprop"]


@pytest.mark.parametrize(
    "phases,replicas,device,needle",
    [
        ("fast", 1, None, "allowed: eager, static, graphs"),
        ("static", 2, None, "one replica per pipeline"),
        ("graphs", 1, torch.device("cpu"), "use 'static'"),
    ],
)
def test_bad_phases_are_refused_in_one_line(phases, replicas, device, needle):
    with pytest.raises(ValueError) as err:
        check_phases(phases, METHODS["petra"], replicas=replicas, device=device)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert "eager" in PHASES


def test_a_static_call_copies_in_and_clones_out():
    calls = []

    def double(inputs):
        calls.append(inputs[0])
        return [inputs[0] * 2]

    call = StaticCall(double, graphs=False, name="double")
    a, b = torch.ones(3), torch.full((3,), 2.0)
    out_a, out_b = call([a])[0], call([b])[0]
    assert calls[0] is calls[1] and calls[0] is not a  # one buffer, not the caller's tensor
    assert torch.equal(out_a, torch.full((3,), 2.0)) and torch.equal(out_b, torch.full((3,), 4.0))
    with pytest.warns(UserWarning, match="another shape"):
        assert torch.equal(call([torch.ones(2)])[0], torch.full((2,), 2.0))
    assert call.unbuffered == 1


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("method,k,recipe", [("petra", 1, LR), ("petra", 2, WARM), ("dsp", 1, LR)])
def test_graphs_give_the_bits_of_static_phases_on_a_gpu(method, k, recipe, deterministic_gpu):
    static = _train(method, "static", device="cuda", k=k, recipe=recipe, n=12, last_batch=4)
    graphs = _train(method, "graphs", device="cuda", k=k, recipe=recipe, n=12, last_batch=4)
    _assert_same_bits(static, graphs)
    assert all(w.phases.forward_call.slot.graph is not None for w in graphs[2].workers[:-1])


@cuda
@pytest.mark.gpu
def test_graphed_runs_resume_with_the_bits_of_an_uninterrupted_one_on_a_gpu(deterministic_gpu):
    whole = _train("petra", "graphs", device="cuda", n=12)
    _assert_same_bits(whole, _train("petra", "graphs", device="cuda", n=12, interrupt_at=14))


@cuda
@pytest.mark.gpu
def test_static_phases_on_a_gpu_give_the_bits_of_eager_ones_or_say_which_differ(deterministic_gpu):
    """On a GPU the fused optimizer's kernel is not the eager foreach one: equal bits are expected,
    and a difference is reported by name (the graphed path is proved against static above)."""
    _assert_same_bits(_train("petra", "eager", device="cuda"), _train("petra", "static", device="cuda"))
