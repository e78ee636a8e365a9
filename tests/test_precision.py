"""The ``precision`` setting (petra_core/precision.py): bf16 autocast around every stage's
compute, with weights, gradients, the loss and the activations stages send kept in float32;
the flags a run records; one-line refusals."""

import json
import math

import pytest
import torch
from conftest import make_batches, make_model, tiny_run

from petra_core import METHODS, Pipeline, Recipe
from petra_core.engine import LocalWorld, PipelineSpec
from petra_core.engine.observers import Observer
from petra_core.models import streams
from petra_core.precision import numerics, set_numerics
from petra_core.run.config import ConfigError, RunConfig

LR = Recipe(base_lr=0.05, weight_decay=5e-4, scale_lr=False)


class SentDtypes(Observer):
    def __init__(self):
        self.dtypes = set()

    def sent(self, worker, direction, msg):
        for a in (getattr(msg, "activation", None), getattr(msg, "grad", None)):
            self.dtypes.update(t.dtype for t in streams.tensors(a))  # a tensor or a pair of streams


def train_pipe(method, precision, n=6):
    model = make_model(method=method)
    batches = make_batches(n)
    pipe = Pipeline.build(
        PipelineSpec(
            model=model,
            method=method,
            world=LocalWorld(),
            num_batches=n,
            get_batch=lambda mb: batches[mb],
            batch_size=6,
            recipe=LR,
            precision=precision,
        )
    )
    sent = SentDtypes()
    pipe.observers.append(sent)
    pipe.run()
    losses = [r.loss for r in pipe.head_log]
    return pipe, losses, sent.dtypes


@pytest.mark.parametrize("method", list(METHODS))
def test_bf16_trains_every_method_with_float32_state_and_messages(method):
    pipe, losses, sent = train_pipe(method, "bf16")
    _, reference, _ = train_pipe(method, "fp32")
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(losses)))
    assert sent <= {torch.float32}, f"{method} sent {sent}"
    for w in pipe.workers:
        assert all(p.dtype == torch.float32 for p in w.params)
        assert all(
            s.dtype == torch.float32
            for st in w.optimizer.state.values()
            for s in st.values()
            if isinstance(s, torch.Tensor) and s.is_floating_point()
        )
    assert losses != reference, "bf16 computed exactly what fp32 did: autocast was not applied"
    # the first loss is computed before any weight moved: bf16 rounding of the same computation
    # (after a few steps at batch 6 the two trajectories part, as any perturbation would make them)
    assert losses[0] == pytest.approx(reference[0], rel=0.02)


def test_fp32_is_the_default_and_changes_no_bit():
    _, default, _ = train_pipe("petra", "fp32")
    model = make_model(method="petra")
    batches = make_batches(6)
    pipe = Pipeline.build(
        PipelineSpec(
            model=model,
            method="petra",
            world=LocalWorld(),
            num_batches=6,
            get_batch=lambda mb: batches[mb],
            batch_size=6,
            recipe=LR,
        )
    )
    pipe.run()
    assert [r.loss for r in pipe.head_log] == default


def test_numerics_are_set_together_and_recorded():
    saved = numerics()
    try:
        flags = set_numerics("tf32", deterministic=False)
        assert flags["tf32_matmul"] and flags["tf32_cudnn"] and flags["cudnn_benchmark"]
        assert not flags["deterministic_algorithms"] and not flags["cudnn_deterministic"]
        flags = set_numerics("fp32", deterministic=True)
        assert not flags["tf32_matmul"] and not flags["tf32_cudnn"] and not flags["cudnn_benchmark"]
        assert flags["deterministic_algorithms"] and flags["cudnn_deterministic"]
    finally:
        set_numerics("tf32" if saved["tf32_matmul"] else "fp32", saved["deterministic_algorithms"])
        torch.backends.cudnn.allow_tf32 = saved["tf32_cudnn"]
        torch.backends.cudnn.benchmark = saved["cudnn_benchmark"]


def test_a_bad_precision_is_one_line():
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(tiny_run(precision="fp16"))
    assert str(err.value) == "precision='fp16' is not allowed; allowed: fp32, tf32, bf16"


def test_a_bf16_run_records_its_precision_and_flags(tmp_path):
    from petra_core.run.trainer import train

    cfg = RunConfig.from_dict(
        tiny_run(
            precision="bf16",
            method="petra",
            epochs=1,
            synthetic_train=64,
            synthetic_test=32,
            batch_size=16,
            bn_reestimate_batches=0,
        )
    )
    metrics = train(cfg, tmp_path / "run", log=lambda m: None)
    assert math.isfinite(metrics["train_loss"]) and 0 < metrics["train_loss"] < 10  # a loss, not NaN or a blow-up
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert env["tf32_matmul"] is False and env["deterministic_algorithms"] is True
    assert {"cpu_model", "cpu_capability", "torch_threads"} <= env.keys()
    assert "precision: bf16" in (tmp_path / "run" / "config.yaml").read_text()


def test_precision_defaults_to_bf16_on_cuda_and_fp32_elsewhere():
    """Unset, a GPU run computes in bf16 (fp32 leaves a GPU waiting for the host); a CPU run in
    fp32, as every committed record was made; a value given is kept, and is what a record says."""
    from petra_core.run.config import RunConfig

    assert RunConfig.from_dict({}).precision == "fp32"
    assert RunConfig.from_dict({"device": "cuda"}).precision == "bf16"
    assert RunConfig.from_dict({"device": "cuda", "precision": "fp32"}).precision == "fp32"
    assert RunConfig.from_dict(RunConfig.from_dict({"device": "cuda"}).to_dict()).precision == "bf16"
