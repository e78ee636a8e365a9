"""A device profile timed by the phase clock on the pipeline (``petra plan profile --device cuda``):
the same code on CPU here, on a GPU in the GPU lane."""

import time

import pytest
import torch

from petra_core.plan.device_profile import measure_device_profile, pipeline_phase_seconds
from petra_core.plan.simulate import predict


@pytest.mark.parametrize("method, k", [("petra", 1), ("backprop", 1), ("1f1b", 2)])
def test_phase_seconds_of_every_stage(method, k):
    times = pipeline_phase_seconds("revnet18", method, batch=2, width=4, stem="cifar", k=k, minibatches=2, device="cpu")
    assert len(times) == 10
    assert all(s["forward"] > 0 and s["backward"] > 0 and s["step"] > 0 for s in times)
    assert all(s["rebuild"] < s["backward"] or method == "petra" for s in times)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible (pytest -m gpu on a GPU)")


@pytest.mark.gpu
@gpu
def test_a_gpu_profile_predicts_its_own_one_device_step():
    """The device times of every phase, summed by the planner for all stages on one GPU, against the
    synced wall time of the same unobserved pipeline: at most it (launch work that overlaps is not
    device time), and not far below it on a model big enough to keep the GPU busy."""
    from petra_core import Pipeline, build_model
    from petra_core.engine import LocalWorld, PipelineSpec

    p = measure_device_profile("revnet18", "backprop", batch=64, width=64, stem="cifar", k=1, minibatches=4,
                               device="cuda", command="test")  # fmt: skip
    predicted = predict(p, placement=[range(p.num_stages)]).seconds_per_minibatch
    model = build_model("revnet18", num_classes=10, stem="cifar", width=64)
    x, y = torch.randn(64, 3, 32, 32, device="cuda"), torch.randint(0, 10, (64,), device="cuda")
    spec = PipelineSpec(model=model, method="backprop", world=LocalWorld(devices=[torch.device("cuda")]),
                        num_batches=12, get_batch=lambda mb: (x, y), batch_size=64)  # fmt: skip
    pipe = Pipeline.build(spec)
    per = 2 * len(model) - 1
    pipe.run(2 * per)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    pipe.run(8 * per)
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / 8
    assert "NVIDIA" in p.device or "H" in p.device
    assert 0.3 * wall < predicted <= 1.1 * wall, (predicted, wall)
