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

**Bounded rebuild chains** (``rebuild_span``, not in the paper). Under PETRA a reversible stage
inverts the output the next stage rebuilt, so a run of consecutive reversible stages compounds
its errors, each inverse with weights that moved since the forward. On a RevNet the
non-reversible downsampling stages cut the runs short; a reversible transformer is one run from
stem to head, and the error grows along it (measured on revgpt, AdamW 1e-3: the rebuilt input of
the first block is off by several times its own norm). :meth:`Method.bounded` ``(span)`` lets at
most ``span`` consecutive reversible stages rebuild from one exact value: the stage before such a
run keeps its input (DSP's buffer, recomputed with current weights) and hands it down exact.
``span = 0``: no bound, the paper's PETRA.

**Weight prediction** (``weight_prediction``, not in the paper): :meth:`Method.predicting` ``(α)``
runs each delayed stage's forward at w + α·τ·Δw, the weights its gradient will land on
(``prediction.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..models.stage import Stage
from .local import ForwardGradientActivity, ForwardGradientWeight, LocalHead, LocalLoss
from .prediction import check_weight_prediction
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
    rebuild_span: int = 0  # most consecutive stages rebuilding from one exact value (0: no bound)
    weight_prediction: float = 0.0  # forward at w + α·τ·Δw (prediction.py; 0: off)

    def policy_for(self, stage: Stage, *, last: bool) -> type[StoragePolicy]:
        """The policy class of a stage on its own, before any bound on rebuild chains (its contract
        can be asked without building one); :meth:`policies` gives a whole model's."""
        if last:
            return self.head
        return self.reversible if stage.reversible else self.other

    @property
    def rebuilds(self) -> bool:
        """Do its reversible stages rebuild their inputs from the next stage's (PETRA, reversible backprop)?"""
        return self.reversible.needs_output_back and not self.reversible.keeps

    def bounded(self, span: int) -> Method:
        """This method with rebuild chains of at most ``span`` stages (0: unbounded, itself)."""
        if isinstance(span, bool) or not isinstance(span, int) or span < 0:
            raise ValueError(f"rebuild_span={span!r} must be an integer >= 0 (0: no bound)")
        if span and not self.rebuilds:
            allowed = ", ".join(m.name for m in METHODS.values() if m.rebuilds)
            raise ValueError(
                f"rebuild_span={span} bounds the chains of stages that rebuild their inputs; method "
                f"{self.name!r} has none (allowed with: {allowed}; rebuild_span=0 otherwise)"
            )
        return self if span == self.rebuild_span else replace(self, rebuild_span=span)

    def predicting(self, alpha: float) -> Method:
        """This method with its delayed stages forwarding at predicted weights (``prediction.py``;
        ``alpha`` 0: off, itself)."""
        alpha = check_weight_prediction(alpha)
        if alpha and self.schedule is not Pipelined:
            allowed = ", ".join(m.name for m in METHODS.values() if m.schedule is Pipelined)
            raise ValueError(
                f"weight_prediction={alpha:g} predicts the weights a delayed gradient lands on; method "
                f"{self.name!r} delays none (allowed with: {allowed}; weight_prediction=0 otherwise)"
            )
        return self if alpha == self.weight_prediction else replace(self, weight_prediction=alpha)

    def policies(self, stages: Sequence) -> list[type[StoragePolicy]]:
        """The policy class of every stage of a model (anything with ``.reversible`` per stage).

        With ``rebuild_span`` s > 0, counting the reversible stages of a run from its end (the
        stage next to the one that keeps its input: 1, 2, ...), those at a multiple of s + 1 keep
        their input (``other``'s policy) instead of rebuilding it."""
        J = len(stages)
        out = [self.policy_for(stage, last=j == J - 1) for j, stage in enumerate(stages)]
        if self.rebuild_span:
            depth = 0  # position in the run of rebuilding stages, from its end
            for j in reversed(range(J)):
                if out[j] is not self.reversible or j == J - 1:
                    depth = 0
                    continue
                depth += 1
                if depth % (self.rebuild_span + 1) == 0:
                    out[j], depth = self.other, 0
        return out

    @property
    def gradients_cross(self) -> bool:
        """Do backward messages go from a stage to the previous one?"""
        return self.head.gradient_out


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
