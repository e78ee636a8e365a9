"""PipelineSpec and Pipeline.build: a bad value is one line naming it, workers are complete when
built, and building a pipeline leaves the process's state alone."""

import subprocess
import sys

import pytest
import torch
from conftest import make_batches, make_model

from petra_core import Pipeline, Recipe
from petra_core.engine import LocalWorld, PipelineSpec

LR = Recipe(base_lr=0.05, scale_lr=False)


def spec(**changes):
    values = dict(
        model=make_model(),
        method="petra",
        world=LocalWorld(),
        num_batches=2,
        get_batch=make_batches(2).__getitem__,
        batch_size=6,
        recipe=LR,
    )
    return PipelineSpec(**{**values, **changes})


@pytest.mark.parametrize(
    "changes,needle",
    [
        (dict(num_batches=-1), "num_batches must be an integer >= 0, got -1"),
        (dict(batch_size=0), "batch_size must be an integer >= 1, got 0"),
        (dict(k=1.5), "accumulation k must be an integer >= 1, got 1.5"),
        (dict(offset=-2), "offset (ticks between replicas' starts) must be an integer >= 0, got -2"),
        (dict(precision="fp8"), "precision 'fp8' is not allowed; allowed:"),
        (dict(batches_per_epoch=0), "batches_per_epoch must be > 0 (or None: num_batches), got 0"),
        (dict(get_batch=None), "this process owns stage 0 of its replica and needs get_batch"),
        (dict(placement="balanced"), "placement 'balanced' needs measured stage costs: pass measure="),
        (dict(rule="cdp9"), "unknown replica rule 'cdp9'; allowed: dp"),
        (dict(method="sgd"), "unknown method 'sgd'"),
    ],
)
def test_a_bad_value_is_one_line_naming_it(changes, needle):
    with pytest.raises(ValueError) as err:
        spec(**changes)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_the_spec_keeps_its_method_and_rule_resolved_and_cannot_change():
    s = spec(rule=None, observers=[])
    assert s.method.name == "petra" and s.rule.name == "dp" and s.observers == () and s.replicas == 1
    with pytest.raises(AttributeError):
        s.k = 2


def test_workers_are_complete_when_built():
    """Each worker knows its place among the model's parameter tensors and whether the next stage
    joins its graph (backprop, one process, one device: every stage but the head) from its
    constructor; nothing is set after it."""
    model = make_model()
    pipe = Pipeline.build(spec(model=model, method="backprop"))
    counts = [len(list(stage.parameters())) for stage in model]
    assert [w.tensor_offset for w in pipe.workers] == [sum(counts[:j]) for j in range(len(model))]
    assert {w.tensors_total for w in pipe.workers} == {sum(counts)}
    assert [w.joins_next for w in pipe.workers] == [True] * (len(model) - 1) + [False]


def test_building_and_running_a_pipeline_leaves_the_host_allocator_alone():
    """retain_freed_memory() is the caller's (the trainer's, a benchmark's) to apply, never the engine's."""
    code = (
        "import torch\n"
        "from petra_core import build_model, simulate\n"
        "from petra_core.engine import host_memory\n"
        "model = build_model('revnet18', num_classes=5, width=4)\n"
        "simulate(model, 'petra', [(torch.randn(2, 3, 16, 16), torch.tensor([0, 1]))] * 2)\n"
        "print(host_memory._applied)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"


def test_a_model_the_method_cannot_train_is_refused_before_anything_moves():
    model = make_model("resnet18")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="'petra' needs reversible stages"):
        spec(model=model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
