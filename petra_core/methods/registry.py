"""The five training methods compared in the paper, as named policies.

A method is (schedule, what a reversible stage keeps, what any other stage keeps). The last
stage (head) runs forward, loss and backward in one tick under every method, so it keeps its
graph for that tick only.

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

The last three are local learning on the same split (``local.py``; they need a model built with
auxiliary heads, ``aux_head``); they are not in the PETRA paper's tables.

PETRA and reversible backprop need reversible stages: on a ResNet they are refused (a ResNet
under "PETRA" would buffer every input, which is DSP — ask for ``dsp``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models.stage import Stage
from ..models.staged import StagedModel
from .local import ForwardGradientActivity, ForwardGradientWeight, LocalHead, LocalLoss
from .storage import KeepGraph, KeepInput, Reconstruct, StashWeights, StoragePolicy


@dataclass(frozen=True)
class Method:
    name: str
    schedule: str  # "pipelined" or "sequential"
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
        Method("backprop", "sequential", KeepGraph, KeepGraph, False, "end-to-end backpropagation"),
        Method(
            "revbackprop",
            "sequential",
            Reconstruct,
            KeepInput,
            True,
            "backpropagation that recomputes reversible stages' inputs from their outputs",
        ),
        Method(
            "delayed",
            "pipelined",
            StashWeights,
            StashWeights,
            False,
            "delayed gradients with activation and weight stashing (PipeDream-like)",
        ),
        Method(
            "dsp",
            "pipelined",
            KeepInput,
            KeepInput,
            False,
            "delayed gradients with input buffers and recomputation on current weights",
        ),
        Method(
            "petra",
            "pipelined",
            Reconstruct,
            KeepInput,
            True,
            "PETRA: reversible stages rebuild their input with current weights, keep nothing",
        ),
        Method(
            "local",
            "sequential",
            LocalLoss,
            LocalLoss,
            False,
            "local learning: each stage learns from its own auxiliary head",
            head=LocalHead,
            needs_aux=True,
        ),
        Method(
            "fg-local-w",
            "sequential",
            ForwardGradientWeight,
            ForwardGradientWeight,
            False,
            "forward gradient, local guess, weight space (Fournier et al. 2023)",
            needs_aux=True,
        ),
        Method(
            "fg-local-a",
            "sequential",
            ForwardGradientActivity,
            ForwardGradientActivity,
            False,
            "forward gradient, local guess, activity space (Fournier et al. 2023)",
            needs_aux=True,
        ),
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
