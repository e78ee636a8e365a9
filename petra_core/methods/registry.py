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

PETRA and reversible backprop need reversible stages: on a ResNet they are refused (a ResNet
under "PETRA" would buffer every input, which is DSP — ask for ``dsp``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..models.stage import Stage
from .storage import KeepGraph, KeepInput, Reconstruct, StashWeights, StoragePolicy


@dataclass(frozen=True)
class Method:
    name: str
    schedule: str  # "pipelined" or "sequential"
    reversible: type[StoragePolicy]  # the policy of reversible stages
    other: type[StoragePolicy]  # the policy of every other stage but the head
    needs_reversible: bool
    summary: str

    def policy_for(self, stage: Stage, *, last: bool) -> type[StoragePolicy]:
        """The policy class of a stage (its contract can be asked without building one)."""
        if last:
            return KeepGraph
        return self.reversible if stage.reversible else self.other

    def storage_for(self, stage: Stage, *, last: bool) -> StoragePolicy:
        """A fresh policy for a stage's worker."""
        return self.policy_for(stage, last=last)()


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("backprop", "sequential", KeepGraph, KeepGraph, False, "end-to-end backpropagation"),
        Method("revbackprop", "sequential", Reconstruct, KeepInput, True,
               "backpropagation that recomputes reversible stages' inputs from their outputs"),
        Method("delayed", "pipelined", StashWeights, StashWeights, False,
               "delayed gradients with activation and weight stashing (PipeDream-like)"),
        Method("dsp", "pipelined", KeepInput, KeepInput, False,
               "delayed gradients with input buffers and recomputation on current weights"),
        Method("petra", "pipelined", Reconstruct, KeepInput, True,
               "PETRA: reversible stages rebuild their input with current weights, keep nothing"),
    )
}


def get_method(method: str | Method) -> Method:
    if isinstance(method, Method):
        return method
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; allowed: {', '.join(METHODS)}")
    return METHODS[method]


def check_method_fits(method: Method, model) -> None:
    """PETRA and reversible backprop are refused on models without reversible stages."""
    if method.needs_reversible and not any(stage.reversible for stage in model):
        allowed = [m.name for m in METHODS.values() if not m.needs_reversible]
        raise ValueError(
            f"method {method.name!r} needs reversible stages but {getattr(model, 'arch', 'this model')!r} "
            f"has none; use a RevNet, or one of: {', '.join(allowed)}"
        )
