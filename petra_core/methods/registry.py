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

from collections.abc import Callable
from dataclasses import dataclass

from ..models.stage import Stage
from .storage import KeepGraph, KeepInput, Reconstruct, StoragePolicy


@dataclass(frozen=True)
class Method:
    name: str
    schedule: str  # "pipelined" or "sequential"
    reversible: Callable[[], StoragePolicy]
    other: Callable[[], StoragePolicy]
    needs_reversible: bool
    summary: str

    def storage_for(self, stage: Stage, *, last: bool) -> StoragePolicy:
        if last:
            return KeepGraph()
        return self.reversible() if stage.reversible else self.other()


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("backprop", "sequential", KeepGraph, KeepGraph, False, "end-to-end backpropagation"),
        Method("revbackprop", "sequential", Reconstruct, KeepInput, True,
               "backpropagation that recomputes reversible stages' inputs from their outputs"),
        Method("delayed", "pipelined", lambda: KeepGraph(stash=True), lambda: KeepGraph(stash=True), False,
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
