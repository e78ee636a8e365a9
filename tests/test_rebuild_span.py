"""Bounded rebuild chains (``Method.bounded``, ``rebuild_span``): which stages keep their input, that
a keeping stage hands down the exact value, that gradients are still backprop's with weights fixed,
that an unbounded span is PETRA's bits, and the one-line refusals."""

import copy

import pytest
import torch
from conftest import BeforeStep, make_model, tiny_run

from petra_core import Recipe, Simulator
from petra_core.accounting.memory import measure_steady_state, predict_steady_state
from petra_core.engine.observers import Observer
from petra_core.families import build
from petra_core.methods import get_method
from petra_core.run.config import ConfigError, RunConfig

LR0 = Recipe(base_lr=0.0, weight_decay=0.0, scale_lr=False)
LR = Recipe(base_lr=0.05, weight_decay=0.0, scale_lr=False)
VOCAB, CONTEXT, BATCH = 7, 5, 3


def revgpt(depth=4, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    return build("revgpt", num_classes=VOCAB, context=CONTEXT, width=8, depth=depth, heads=2).to(dtype)


def windows(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    text = [torch.randint(0, VOCAB, (BATCH, CONTEXT + 1), generator=g) for _ in range(n)]
    return [(t[:, :-1], t[:, 1:]) for t in text]


def names(method, span, model):
    return [p.name for p in get_method(method).bounded(span).policies(list(model))]


def test_the_stages_that_keep_their_input_are_every_span_plus_first_counted_from_the_runs_end():
    """revgpt of 4 blocks (stem, 4 reversible stages, head): one run of 4 rebuilding stages, cut
    every span + 1 counted from the head's side; span 0 or >= 4 leaves PETRA's policies."""
    model = revgpt()
    petra = ["input", "reconstruct", "reconstruct", "reconstruct", "reconstruct", "graph"]
    assert names("petra", 0, model) == names("petra", 4, model) == petra
    assert names("petra", 1, model) == ["input", "input", "reconstruct", "input", "reconstruct", "graph"]
    assert names("petra", 2, model) == ["input", "reconstruct", "input", "reconstruct", "reconstruct", "graph"]
    assert names("petra", 3, model) == ["input", "input", "reconstruct", "reconstruct", "reconstruct", "graph"]
    assert names("revbackprop", 1, model) == names("petra", 1, model)
    # a RevNet's runs are cut by its non-reversible stages already: the count starts again after each
    net = make_model("revnet18")
    kinds = [s.reversible for s in net]
    bounded = get_method("petra").bounded(1).policies(list(net))
    run = 0
    for j in reversed(range(len(net) - 1)):
        run = run + 1 if kinds[j] else 0
        assert (bounded[j].name == "reconstruct") == (kinds[j] and run % 2 == 1), j
        run = 0 if bounded[j].name != "reconstruct" else run


class HandedDown(Observer):
    """Per stage and minibatch: the activation it sent forward, and the one it handed down."""

    def __init__(self):
        self.up, self.down = {}, {}

    def sent(self, worker, direction, msg):
        a = getattr(msg, "activation", None)
        if a is not None:
            (self.up if direction == "forward" else self.down)[(worker.index, msg.mb)] = [t.clone() for t in a]


def test_a_keeping_stage_hands_down_the_exact_input_where_petra_hands_down_a_rebuilt_one():
    """Weights moving: with span 1 stage 3 keeps its input and hands down exactly what stage 2 sent
    it; under PETRA (span 0) stage 3 hands down its rebuilt input, off by the weights' drift."""
    data = windows(8)
    off = {}
    for span in (0, 1):
        model = revgpt()
        sim = Simulator(model, get_method("petra").bounded(span), num_batches=8, get_batch=data.__getitem__,
                        batch_size=BATCH, recipe=LR)  # fmt: skip
        seen = HandedDown()
        sim.observers.append(seen)
        sim.run()
        pairs = [(seen.up[(2, mb)], seen.down[(3, mb)]) for mb in range(8) if (3, mb) in seen.down]
        assert len(pairs) == 8
        off[span] = max(float((a - b).abs().max()) for up, down in pairs for a, b in zip(up, down))
    assert off[1] == 0.0 and off[0] > 1e-6, off


def test_with_weights_fixed_a_bounded_petra_gives_backprop_gradients():
    n = 4
    data = windows(n, seed=2)
    model = revgpt()
    reference = copy.deepcopy(model)
    for x, y in data:
        model.family.loss(reference(x), y).backward()
    sums = [None] * len(model)

    def capture(worker):
        g = torch.cat([p.grad.flatten() for p in worker.stage.parameters()]).clone()
        sums[worker.index] = g if sums[worker.index] is None else sums[worker.index] + g

    sim = Simulator(model, get_method("petra").bounded(1), num_batches=n, get_batch=data.__getitem__,
                    batch_size=BATCH, recipe=LR0)  # fmt: skip
    sim.observers.append(BeforeStep(capture))
    sim.run()
    for j, stage in enumerate(reference):
        true = torch.cat([p.grad.flatten() for p in stage.parameters()])
        assert float((sums[j] - true).norm() / true.norm()) < 1e-12, j


def test_a_span_as_long_as_the_run_is_petras_bits():
    data = windows(6, seed=1)
    finals = []
    for method in (get_method("petra"), get_method("petra").bounded(4)):
        model = revgpt(dtype=torch.float32)
        sim = Simulator(model, method, num_batches=6, get_batch=data.__getitem__, batch_size=BATCH, recipe=LR)
        sim.run()
        finals.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*finals))


def test_the_memory_account_buffers_the_keeping_stages_inputs():
    """Steady-state accounting (``accounting/memory.py``) follows the bounded policies: stages 1 and
    3 of a 4-block revvit hold input buffers under span 1, none under PETRA; what the run holds
    matches the prediction."""
    torch.manual_seed(0)
    model = build("revvit", num_classes=4, image_size=8, patch=4, width=8, depth=4, heads=2)

    def buffered(method):
        rows = predict_steady_state(model, method, batch=BATCH, image_size=8)
        return sorted({r["stage"] for r in rows if r["component"] == "input_buffer"} - {0})

    assert buffered("petra") == []
    assert buffered(get_method("petra").bounded(1)) == [1, 3]
    measured = measure_steady_state(model, get_method("petra").bounded(1), batch=BATCH, image_size=8, num_classes=4)
    assert measured["held_bytes"] == measured["predicted_buffer_bytes"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(method="dsp", rebuild_span=1), "rebuild_span=1 bounds the chains of stages that rebuild their inputs; "
         "method 'dsp' has none (allowed with: revbackprop, petra; rebuild_span=0 otherwise)"),
        (dict(method="petra", rebuild_span=-1), "rebuild_span=-1 must be >= 0"),
    ],
)  # fmt: skip
def test_a_span_a_method_cannot_use_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(tiny_run(**overrides))
    assert str(err.value) == message
