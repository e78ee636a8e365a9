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
from weakref import WeakKeyDictionary

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

_NORMS: WeakKeyDictionary = WeakKeyDictionary()  # module -> its batch-norm layers


def norms_of(module: nn.Module) -> list[_BatchNorm]:
    """The batch-norm layers of ``module``, found once: a stage's layers are fixed when it is built,
    and a pipelined method freezes every stage's statistics twice a tick."""
    norms = _NORMS.get(module)
    if norms is None:
        norms = _NORMS[module] = [m for m in module.modules() if isinstance(m, _BatchNorm)]
    return norms


@contextmanager
def frozen_running_stats(module: nn.Module) -> Iterator[None]:
    """Normalise with batch statistics but leave running statistics (and their counter) untouched."""
    norms = [m for m in norms_of(module) if m.track_running_stats]
    for m in norms:
        m.track_running_stats = False
    try:
        yield
    finally:
        for m in norms:
            m.track_running_stats = True
