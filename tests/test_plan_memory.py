"""The planner's memory against the allocator: what a pipeline holds at the end of a steady tick, in
one process on CPU (``accounting.measure_steady_state``: every byte the run allocated and still
holds), against the plan's bytes from the meta device."""

import pytest
import torch

from petra_core.accounting import measure_steady_state
from petra_core.families import build_model
from petra_core.plan.memory import device_held_bytes
from petra_core.plan.search import sized_profile


@pytest.mark.parametrize("method, tolerance", [("petra", 1e-3), ("dsp", 1e-3), ("delayed", 0.05)])
def test_held_bytes_match_the_allocator(method, tolerance):
    """Buffered inputs, messages in flight and optimizer state are exact shapes (within 0.1 %); a
    kept graph (delayed) is estimated from autograd's saved tensors on the meta device (within 5 %).
    Weights existed before the meter started; gradients are freed at the step (k = 1)."""
    torch.manual_seed(0)
    model = build_model("revnet18", num_classes=10, stem="cifar", width=4)
    measured = measure_steady_state(model, method, batch=4, image_size=32)["allocated_bytes"]
    stages = sized_profile("revnet18", 4, method, batch=4, stem="cifar").stages
    (planned,) = device_held_bytes(stages, method, [range(len(stages))])
    assert planned == pytest.approx(measured, rel=tolerance)
