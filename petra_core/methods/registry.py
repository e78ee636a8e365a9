"""The training methods, as named policies: the paper's five, two synchronous pipeline baselines
and three local-learning methods.

A method is (schedule type, what a reversible stage keeps, what any other stage keeps). The
last stage (head) runs forward, loss and backward in one tick under every method.

| method      | schedule   | reversible stage          | other stages                   |
|-------------|------------|---------------------------|--------------------------------|
| backprop    | sequential | graph                     | graph                          |
| revbackprop | sequential | nothing (inverse)         | input (recompute)              |
| delayed     | pipelined  | graph + weight stash      | graph + weight stash           |
| dsp         | pipelined  | input (recompute, current weights) | input                 |
| petra       | pipelined  | nothing (inverse, current weights) | input                 |
| local       | sequential | graph; learns from its auxiliary head's loss only (no gradient crosses stages) |
| fg-local-w  | sequential | graph; true gradient projected on the local-loss gradient, per weight tensor  |
| fg-local-a  | sequential | graph; the same on the stage's output, per sample, backpropagated in the stage |
| gpipe       | gpipe      | graph                     | graph                          |
| 1f1b        | 1f1b       | graph                     | graph                          |

``gpipe`` and ``1f1b`` are backprop's storage under a pipeline flushed every k microbatches (k,
the accumulation, is the microbatches per flush; ``schedule.py``). No weight moves in flight and
every stage runs its backwards in forward order, so gradients accumulate as backprop's do: the
same bits as ``backprop`` with the same k (tests/test_methods.py).

The last three are local learning on the same split (``local.py``; they need a model built with
auxiliary heads, ``aux_head``); they are not in the PETRA paper's tables.

PETRA and reversible backprop need reversible stages: on a ResNet they are refused (a ResNet
under "PETRA" would buffer every input, which is DSP — ask for ``dsp``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..models.stage import Stage
from .local import ForwardGradientActivity, ForwardGradientWeight, LocalHead, LocalLoss
from .schedule import GPipe, OneFOneB, Pipelined, Schedule, Sequential
from .storage import KeepGraph, KeepInput, Reconstruct, StashWeights, StoragePolicy

if TYPE_CHECKING:  # a type only: the report floor reads the method table without the model code
    from ..models.staged import StagedModel


@dataclass(frozen=True)
class Method:
    name: str
    schedule: type[Schedule]  # built per run: schedule(num_stages, num_batches, k=k)
    reversible: type[StoragePolicy]  # the policy of reversible stages
    other: type[StoragePolicy]  # the policy of every other stage but the head
    needs_reversible: bool
    summary: str
    head: type[StoragePolicy] = KeepGraph  # the policy of the last stage (loss and backward in one tick)
    needs_aux: bool = False  # trains stages from auxiliary heads (a model built with aux_head)

    def policy_for(self, stage: Stage, *, last: bool) -> type[StoragePolicy]:
        """The policy class of a stage (its contract can be asked without building one)."""
        if last:
            return self.head
        return self.reversible if stage.reversible else self.other

    @property
    def gradients_cross(self) -> bool:
        """Do backward messages go from a stage to the previous one?"""
        return self.head.gradient_out

    def storage_for(self, stage: Stage, *, last: bool) -> StoragePolicy:
        """A fresh policy for a stage's worker."""
        return self.policy_for(stage, last=last)()


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("backprop", Sequential, KeepGraph, KeepGraph, False, "end-to-end backpropagation"),
        Method(
            "revbackprop",
            Sequential,
            Reconstruct,
            KeepInput,
            True,
            "backpropagation that recomputes reversible stages' inputs from their outputs",
        ),
        Method(
            "delayed",
            Pipelined,
            StashWeights,
            StashWeights,
            False,
            "delayed gradients with activation and weight stashing (PipeDream-like)",
        ),
        Method(
            "dsp",
            Pipelined,
            KeepInput,
            KeepInput,
            False,
            "delayed gradients with input buffers and recomputation on current weights",
        ),
        Method(
            "petra",
            Pipelined,
            Reconstruct,
            KeepInput,
            True,
            "PETRA: reversible stages rebuild their input with current weights, keep nothing",
        ),
        Method(
            "local",
            Sequential,
            LocalLoss,
            LocalLoss,
            False,
            "local learning: each stage learns from its own auxiliary head",
            head=LocalHead,
            needs_aux=True,
        ),
        Method(
            "fg-local-w",
            Sequential,
            ForwardGradientWeight,
            ForwardGradientWeight,
            False,
            "forward gradient, local guess, weight space (Fournier et al. 2023)",
            needs_aux=True,
        ),
        Method(
            "fg-local-a",
            Sequential,
            ForwardGradientActivity,
            ForwardGradientActivity,
            False,
            "forward gradient, local guess, activity space (Fournier et al. 2023)",
            needs_aux=True,
        ),
        Method("gpipe", GPipe, KeepGraph, KeepGraph, False, "backprop pipelined GPipe-style, k microbatches a flush"),
        Method("1f1b", OneFOneB, KeepGraph, KeepGraph, False, "backprop pipelined 1F1B (PipeDream-Flush), k a flush"),
    )
}


def get_method(method: str | Method) -> Method:
    if isinstance(method, Method):
        return method
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; allowed: {', '.join(METHODS)}")
    return METHODS[method]


def check_method_fits(method: Method, model: StagedModel) -> None:
    """PETRA and reversible backprop are refused on models without reversible stages; local
    learning on models without auxiliary heads (what the method declares it needs)."""
    if method.needs_aux and not model.has_aux_heads:
        raise ValueError(
            f"method {method.name!r} trains stages from auxiliary heads, and this model has none; "
            f"build it with aux_head='cnn' or 'linear' (petra train: aux_head=cnn)"
        )
    if method.needs_reversible and not any(stage.reversible for stage in model):
        allowed = [m.name for m in METHODS.values() if not m.needs_reversible]
        raise ValueError(
            f"method {method.name!r} needs reversible stages but {model.arch!r} "
            f"has none; use a RevNet, or one of: {', '.join(allowed)}"
        )
