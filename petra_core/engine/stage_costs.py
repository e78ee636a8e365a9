"""Measured cost of every stage, for placing stages on devices (``placement: balanced``).

It lives with the engine, beside the placement it feeds: it times the stages as a worker runs them
and needs nothing above the engine, so a run (``run/session.py``) can pass it in without reaching
up to the accounting."""

from __future__ import annotations

import copy
import statistics
import time

import torch
from torch import Tensor

from ..batchnorm import frozen_running_stats
from ..methods import get_method
from ..models import streams


def measure_stage_costs(
    model, sample: tuple[Tensor, Tensor], *, method=None, device: torch.device | str = "cpu", repeats: int = 3
) -> list[float]:
    """Seconds per minibatch of each stage: forward + backward, plus one more forward for stages
    that recompute under ``method`` (PETRA, DSP: Table 1's 4 units instead of 3).

    Runs on a deep copy with running statistics frozen, so the model (weights, batch-norm
    statistics, gradients) is untouched. Median of ``repeats`` timings after one warm-up.
    """
    device = torch.device(device)
    net = copy.deepcopy(model).to(device).train()
    x, labels = streams.apply(lambda t: t.to(device), sample[0]), sample[1].to(device)
    J = len(net)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    costs = []
    with frozen_running_stats(net):
        for j, stage in enumerate(net):
            last = j == J - 1
            twice = method is not None and get_method(method).policy_for(stage, last=last).recomputes
            times = []
            for rep in range(repeats + 1):
                sync()
                t0 = time.perf_counter()
                if twice:
                    with torch.no_grad():
                        stage(x)
                leaf = streams.leaves(x, j > 0)
                y = stage(leaf)
                if last:
                    net.family.loss(y, labels).backward()
                else:
                    outs = [t for t in streams.tensors(y) if t.requires_grad]
                    torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
                sync()
                if rep > 0:
                    times.append(time.perf_counter() - t0)
            stage.zero_grad(set_to_none=True)
            costs.append(statistics.median(times))
            x = streams.apply(torch.Tensor.detach, y)
    return costs
