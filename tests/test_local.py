"""Local learning on the stage split (methods local, fg-local-w, fg-local-a; issue: beyond the paper's table).

Oracles: a forward gradient whose guess is the true gradient is backprop; forward gradients of
random Gaussian guesses average to the true gradient (the projection, to it over d); forward-mode
differentiation measures the same directional derivative as backprop; `local` sends no gradient
across stages; auxiliary heads stay under 10 % of the network's FLOPs, and a model without them
is the model as before.
"""

import copy
import gc
import weakref

import pytest
import torch
import torch.nn.functional as F
from conftest import make_batches, make_model
from torch.utils.flop_counter import FlopCounterMode

from petra_core import Recipe, Simulator, build_model, simulate
from petra_core.batchnorm import frozen_running_stats
from petra_core.methods import ForwardGradient, KeepGraph, directional_derivative, project
from petra_core.methods.local import ForwardGradientActivity, ForwardGradientWeight
from petra_core.models import streams

LR = Recipe(base_lr=0.05, weight_decay=5e-4, scale_lr=False)


def main_params(model):
    heads = {id(p) for s in model if getattr(s, "aux", None) is not None for p in s.aux.parameters()}
    return {n: p for n, p in model.named_parameters() if id(p) not in heads}


@pytest.mark.parametrize("policy", [ForwardGradientWeight, ForwardGradientActivity, KeepGraph])
def test_a_kept_graph_is_freed_after_its_backward_and_when_dropped(policy):
    """The stage output a policy keeps dies with its record, whether the backward retained the
    graph on the way (fg-local-w: it leaked about 5 MB a tick at width 16 when a saved output
    held its own grad_fn) or never ran (a record dropped in flight)."""
    stage = make_model("resnet18", torch.float64, aux_head="cnn")[1]
    x, labels = torch.randn(6, 4, 16, 16, dtype=torch.float64), torch.randint(0, 5, (6,))
    for run_backward in (True, False):
        p = policy()
        y = p.forward(stage, 0, x, input_grad=True, version=0)
        alive = weakref.ref(y)
        if run_backward:
            graph = p.local_graph(stage, 0, y, input_grad=True)
            p.backward(stage, graph, torch.ones_like(y), labels, 1)
            del graph
        else:
            p.records.clear()
        del y
        gc.collect()
        assert alive() is None, (policy.__name__, run_backward)


@pytest.mark.parametrize("method", ["fg-local-w", "fg-local-a"])
@pytest.mark.parametrize("arch", ["revnet18", "resnet18"])
def test_a_forward_gradient_that_guesses_the_true_gradient_is_backprop(method, arch, monkeypatch):
    monkeypatch.setattr(
        ForwardGradient, "guess", lambda self, stage, graph, labels, k, wrt, target, output=None: target
    )
    data = make_batches(6, torch.float64)
    fg, bp = make_model(arch, torch.float64, aux_head="cnn"), make_model(arch, torch.float64, aux_head="cnn")
    simulate(fg, method, data, k=2, recipe=LR)
    simulate(bp, "backprop", data, k=2, recipe=LR)
    got, want = main_params(fg), main_params(bp)
    for name, p in want.items():
        assert float((got[name] - p).detach().norm() / p.detach().norm()) < 1e-10, name


def test_forward_gradients_of_gaussian_guesses_average_to_the_true_gradient():
    """For u ~ N(0, I_d): E[<g, u> u] = g, the forward gradient is unbiased, and the mean of N of
    them misses g by about sqrt((d + 1) / N) relative; the projection <g, u> u / <u, u> averages
    to g / d (u / |u| is uniform on the sphere). Fixed seed: a statistical check, within 2x the
    expected error, shrinking as N grows."""
    model = make_model(dtype=torch.float64)
    x, y = make_batches(1, torch.float64)[0]
    F.cross_entropy(model(x), y).backward()
    g = torch.cat([p.grad.flatten() for p in model[1].parameters()])
    d = g.numel()
    gen = torch.Generator().manual_seed(0)
    sums, counts, errors = torch.zeros_like(g), 0, {}
    for n in (12_500, 50_000, 200_000):
        while counts < n:
            u = torch.randn(12_500, d, generator=gen, dtype=torch.float64)
            sums += ((u @ g)[:, None] * u).sum(0)
            counts += len(u)
        errors[n] = float((sums / counts - g).norm() / g.norm())
        assert errors[n] < 2 * ((d + 1) / n) ** 0.5, (n, errors[n], d)
    assert errors[200_000] < errors[12_500] / 2
    u = torch.randn(20_000, d, generator=gen, dtype=torch.float64)
    projected = torch.stack([project(g, ui) for ui in u]).mean(0) * d
    assert float((projected - g).norm() / g.norm()) < 2 * ((d + 2) / len(u)) ** 0.5


def test_forward_mode_measures_the_directional_derivative_backprop_gives():
    """What a real forward-gradient system computes (a JVP of the network's loss along the guess,
    no backward pass) is the inner product the simulator takes from backprop."""
    model = make_model(dtype=torch.float64)
    x, y = make_batches(1, torch.float64)[0]
    stage = model[2]
    names = [n for n, _ in stage.named_parameters()]
    params = [p.detach() for p in stage.parameters()]
    with torch.no_grad():
        h = model[:2](x)

    def loss_of(ps):
        out = torch.func.functional_call(stage, dict(zip(names, ps)), (h,))
        return F.cross_entropy(model[3:](out), y)

    with frozen_running_stats(model):  # batch statistics, as in training; nothing mutated under the JVP
        true = torch.autograd.grad(loss_of(list(stage.parameters())), list(stage.parameters()))
        u = [torch.randn_like(p) for p in params]
        jvp = directional_derivative(loss_of, params, u)
    assert float(jvp.detach()) == pytest.approx(float(sum((g * v).sum() for g, v in zip(true, u))), rel=1e-10)


def test_local_learning_sends_no_gradient_across_stages():
    """With auxiliary losses that do not depend on a stage, `local` leaves every stage but the
    head as it was: nothing reaches them from the head."""
    model = make_model(dtype=torch.float64, aux_head="cnn")
    before = copy.deepcopy(model)
    for stage in list(model)[:-1]:
        stage.aux = torch.nn.Module()
        stage.aux.forward = lambda h: torch.zeros(h.shape[0], 5, dtype=h.dtype, requires_grad=True)
    sim = Simulator(
        model,
        "local",
        num_batches=6,
        get_batch=make_batches(6, torch.float64).__getitem__,
        batch_size=6,
        recipe=Recipe(base_lr=0.05, weight_decay=0.0, scale_lr=False),
    )
    sim.run()
    for j in range(len(model) - 1):
        for (name, a), b in zip(model[j].named_parameters(), before[j].parameters()):
            assert torch.equal(a, b), f"stage {j}: {name} moved"
    assert not torch.equal(model[-1].fc.weight, before[-1].fc.weight)  # the head learned
    assert all(w.storage.gradient_out is False for w in sim.workers)


@pytest.mark.parametrize("arch", ["revnet18", "resnet18", "revnet50"])
def test_auxiliary_heads_are_small_and_optional(arch):
    torch.manual_seed(0)
    plain = build_model(arch, num_classes=10, width=8)
    torch.manual_seed(0)
    with_heads = build_model(arch, num_classes=10, width=8, aux_head="cnn")
    assert with_heads.num_params() == plain.num_params() and with_heads.num_params(aux=True) > 0
    assert [n for n, _ in plain.named_parameters()] == list(main_params(with_heads))
    x = torch.randn(2, 3, 32, 32)
    with FlopCounterMode(display=False) as main:
        plain(x)
    with FlopCounterMode(display=False) as heads:
        h = x
        for stage in list(with_heads)[:-1]:
            h = stage(h)
            stage.aux(streams.join(h))  # a RevNet's pair of streams, side by side
    aux_flops = heads.get_total_flops() - (
        main.get_total_flops() - 2 * 10 * 8 * 8 * (2 if "rev" in arch else 1) * (4 if arch.endswith("50") else 1)
    )
    assert aux_flops / main.get_total_flops() < 0.10


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(method="local"), "set aux_head"),
        (dict(method="petra", aux_head="cnn"), "only used by local learning"),
        (dict(method="local", aux_head="mlp"), "aux_head='mlp' is not allowed"),
    ],
)
def test_bad_local_learning_configs(kwargs, needle):
    from petra_core.run.config import ConfigError, RunConfig

    with pytest.raises(ConfigError, match=needle):
        RunConfig.from_dict(kwargs)


def test_a_model_without_heads_is_refused_by_local_methods():
    with pytest.raises(ValueError, match="auxiliary heads"):
        simulate(make_model(dtype=torch.float64), "local", make_batches(2, torch.float64))
