"""Model families (issue: the model-family seam): a family defined here, and registered, trains
through the engine unchanged; the image family keeps the loss bits of the engine's old head.

The toy family is regression, not classification, so nothing of the image family can stand in
for it: an MLP on synthetic vectors, three stages, none reversible; mean squared error; the head
sums squared and absolute errors.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import BeforeStep
from torch import nn

from petra_core import Recipe, Simulator, build_model, simulate
from petra_core.accounting.shapes import stage_shapes
from petra_core.engine import HeadLog, HeadRecord, LocalWorld, Pipeline, PipelineSpec
from petra_core.families import IMAGES, ModelFamily, build, family_of, register_family, registry
from petra_core.models import StagedModel
from petra_core.models.stage import Stage
from petra_core.precision import widen
from petra_core.run.evaluation import evaluate
from petra_core.run.trainer import epoch_record

DIM, HIDDEN, OUT = 6, 8, 2
LR0 = Recipe(base_lr=0.0, scale_lr=False)
LR = Recipe(base_lr=0.05, momentum=0.0, weight_decay=0.0, scale_lr=False)


class Layer(Stage):
    def __init__(self, c_in: int, c_out: int, relu: bool, kind: str):
        super().__init__()
        self.linear, self.relu, self.kind = nn.Linear(c_in, c_out), relu, kind

    def forward(self, x):
        y = self.linear(x)
        return torch.relu(y) if self.relu else y


class VectorRegression(ModelFamily):
    name = "toy-vector-regression"
    train_sums = ("squared_error", "absolute_error")
    eval_names = ("test_mse", "test_mae")

    @property
    def archs(self):
        return ("mlp3",)

    def build(self, arch, *, hidden=HIDDEN):
        return self.staged(
            arch, [Layer(DIM, hidden, True, "S"), Layer(hidden, hidden, True, "B"), Layer(hidden, OUT, False, "H")]
        )

    def loss(self, output, targets):
        return F.mse_loss(widen(output), targets)

    def minibatch_sums(self, output, targets):
        error = output - targets
        return torch.stack([error.square().sum(), error.abs().sum()])

    def train_record(self, loss_sum, sums, n):
        return {"train_loss": loss_sum / n, "train_mae": sums[1] / (n * OUT)}

    def eval_sums(self, output, targets):
        error = output - targets
        return {"sq": float(error.square().sum()), "abs": float(error.abs().sum()), "values": float(error.numel())}

    def eval_record(self, sums, n):
        return {"test_mse": sums["sq"] / sums["values"], "test_mae": sums["abs"] / sums["values"]}

    def sample_input(self, batch, *, device=None):
        return torch.zeros(batch, DIM, device=device)


TOY = VectorRegression()


@pytest.fixture(autouse=True)
def toy_registered(monkeypatch):
    """The toy family registered for one test (the registry as it was afterwards)."""
    monkeypatch.setattr(registry, "FAMILIES", dict(registry.FAMILIES))
    register_family(TOY)


def vectors(n, dtype=torch.float64, batch=5, seed=0):
    """``n`` minibatches of vectors with a linear target (learnable by the MLP)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(DIM, OUT, generator=g, dtype=dtype)
    batches = []
    for _ in range(n):
        x = torch.randn(batch, DIM, generator=g, dtype=dtype)
        batches.append((x, x @ w))
    return batches


def toy_model(dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    return build("mlp3").to(dtype)


def grads(module):
    return torch.cat([p.grad.flatten() for p in module.parameters()])


def test_a_registered_family_builds_its_archs():
    model = toy_model()
    assert family_of("mlp3") is TOY and model.family is TOY and model[-1].objective is TOY
    assert model.kinds == "S B H" and model.reversible_stages == []
    assert copy.deepcopy(model).family is TOY and model[1:].family is TOY


@pytest.mark.parametrize("method", ["backprop", "delayed"])
def test_a_toy_family_trains_exactly_backprop_when_weights_do_not_move(method):
    """lr = 0: every stage accumulates the gradients of the family's loss on the whole model."""
    n, k = 6, 2
    batches = vectors(n)
    model = toy_model()
    reference = copy.deepcopy(model)
    losses = []
    for x, y in batches:
        loss = TOY.loss(reference(x), y)
        (loss / k).backward()
        losses.append(float(loss.detach()))
    sums = [None] * len(model)

    def capture(worker):
        g = grads(worker.stage).clone()
        sums[worker.index] = g if sums[worker.index] is None else sums[worker.index] + g

    sim = Simulator(model, method, num_batches=n, get_batch=batches.__getitem__, batch_size=5, k=k, recipe=LR0)
    sim.observers.append(BeforeStep(capture))
    sim.run()
    for j, stage in enumerate(reference):
        assert float((sums[j] - grads(stage)).norm() / grads(stage).norm()) < 1e-12, f"stage {j}"
    log = sim.head_log
    assert [r.mb for r in log] == list(range(n)) and all(r.n == 5 for r in log)
    assert [r.loss for r in log] == pytest.approx(losses, rel=1e-12)
    for r, (x, y) in zip(log, batches):  # the family's sums, as it defines them
        error = (reference(x) - y).detach()
        assert r.sums == pytest.approx((float(error.square().sum()), float(error.abs().sum())), rel=1e-12)


def test_delayed_gradients_train_a_toy_family():
    batches = vectors(60, seed=1)
    runs = {}
    for method in ("backprop", "delayed"):
        model = toy_model()
        runs[method] = (model, simulate(model, method, batches, recipe=LR).head_log)
    (bp, bp_log), (delayed, delayed_log) = runs["backprop"], runs["delayed"]
    for log in (bp_log, delayed_log):
        first, last = (sum(r.loss for r in part) / len(part) for part in (log[:10], log[-10:]))
        assert last < first / 2, (first, last)
    # stale gradients: the two runs differ (the delay is real), from the first minibatch whose
    # gradient reached stage 0 late on
    assert not torch.equal(bp[0].linear.weight, delayed[0].linear.weight)
    assert [r.loss for r in bp_log[:1]] == [r.loss for r in delayed_log[:1]]


class Stream:
    def __init__(self, batches):
        self.batches = batches

    def iter_epoch(self, epoch):
        return iter(self.batches)


def test_evaluation_and_epoch_records_ask_the_family():
    model = toy_model()
    batches = vectors(3, seed=2)
    test = evaluate(model, Stream(batches))
    with torch.no_grad():
        errors = torch.cat([(model(x) - y).flatten() for x, y in batches])
    assert test == pytest.approx({"test_mse": float(errors.square().mean()), "test_mae": float(errors.abs().mean())})
    logs = [HeadRecord(0, 2.0, (30.0, 8.0), 4), HeadRecord(1, 1.0, (10.0, 4.0), 4)]

    class Data:
        test = Stream(batches)

    no_eval = epoch_record(0, logs, 0.1, None, Data, 1.0, 8, TOY)
    assert no_eval["train_loss"] == 1.5 and no_eval["train_mae"] == 12.0 / 16
    assert no_eval["test_mse"] is None and no_eval["test_mae"] is None and "train_acc" not in no_eval
    assert epoch_record(0, logs, 0.1, model, Data, 1.0, 8, TOY)["test_mse"] == pytest.approx(test["test_mse"])


def test_stage_shapes_propagate_the_family_sample_input():
    rows = stage_shapes(toy_model(torch.float32), batch=4)
    assert [r["input_shape"] for r in rows] == [(4, DIM), (4, HIDDEN), (4, HIDDEN)]
    assert rows[-1]["output_shape"] == (4, OUT)
    assert all(r["input_numel_paper"] == r["input_numel"] for r in rows)  # one stream: nothing reversible


def test_unknown_archs_and_clashing_families_are_refused():
    with pytest.raises(ValueError, match=r"unknown arch 'mlp4'; allowed: .*revnet18.*mlp3"):
        build("mlp4")

    class Clash(VectorRegression):
        name = "clash"

        @property
        def archs(self):
            return ("revnet18",)

    with pytest.raises(
        ValueError, match=r"'clash' offers archs another family offers: revnet18 \(image-classification\)"
    ):
        register_family(Clash())
    with pytest.raises(ValueError, match="must be a ModelFamily"):
        register_family(object())


def test_a_head_without_an_objective_is_refused():
    stages = [Layer(DIM, OUT, False, "S"), Layer(OUT, OUT, False, "H")]
    with pytest.raises(ValueError, match=r"the last stage \(Layer\) has no objective"):
        spec = PipelineSpec(
            model=StagedModel("bare", stages),
            method="backprop",
            world=LocalWorld(),
            num_batches=1,
            batch_size=4,
            get_batch=lambda mb: (torch.zeros(4, DIM), torch.zeros(4)),
        )
        Pipeline.build(spec)


def test_the_image_family_keeps_the_engine_loss_bits():
    model = build_model("revnet18", num_classes=5, width=4)
    assert model.family is IMAGES and model[-1].objective is IMAGES and family_of("resnet50") is IMAGES
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(6, 5, generator=g), torch.randint(0, 5, (6,), generator=g)
    assert torch.equal(IMAGES.loss(logits, labels), F.cross_entropy(logits, labels))
    half = logits.bfloat16()  # bf16 logits: the loss in float32, as the engine's head took it
    assert torch.equal(IMAGES.loss(half, labels), F.cross_entropy(half.float(), labels))
    assert torch.equal(IMAGES.minibatch_sums(logits, labels), (logits.argmax(1) == labels).sum().reshape(1))
    assert IMAGES.train_record(6.0, [3.0], 4) == {"train_loss": 1.5, "train_acc": 75.0}


def test_head_logs_of_checkpoints_written_before_families_load():
    """A checkpoint's head log held (mb, loss, correct, n): the correct count is the image family's one sum."""
    log = HeadLog()
    log.load_state_dict([(0, 1.25, 3, 6), (1, 0.5, 5, 6)])
    assert log.records() == [HeadRecord(0, 1.25, (3.0,), 6), HeadRecord(1, 0.5, (5.0,), 6)]
    assert epoch_record(0, log.records(), 0.1, None, None, 1.0, 12, IMAGES)["train_acc"] == 100 * 8 / 12
    log.load_state_dict(log.state_dict())  # today's state round-trips
    assert log.records() == [HeadRecord(0, 1.25, (3.0,), 6), HeadRecord(1, 0.5, (5.0,), 6)]
