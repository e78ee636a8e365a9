"""The batch-norm policy, in one place.

Training passes normalise with batch statistics. A stage updates its running statistics
(used at evaluation) exactly once per minibatch: in the pass whose local graph is
backpropagated. Methods that keep the forward graph (backprop, delayed gradients, the head)
update them in the forward; methods that rebuild the graph in the backward (DSP, reversible
backprop, PETRA — recomputation from a buffered input or reconstruction from the output) update
them during that rebuild, as the paper describes, and run their forward with the statistics
frozen. Evaluation uses the running statistics and never changes them.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


@contextmanager
def frozen_running_stats(module: nn.Module) -> Iterator[None]:
    """Normalise with batch statistics but leave running statistics (and their counter) untouched."""
    norms = [m for m in module.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
    for m in norms:
        m.track_running_stats = False
    try:
        yield
    finally:
        for m in norms:
            m.track_running_stats = True


def batches_tracked(module: nn.Module) -> list[int]:
    """num_batches_tracked of every batch-norm layer (tests check one update per minibatch)."""
    return [int(m.num_batches_tracked) for m in module.modules() if isinstance(m, _BatchNorm)]
