"""Closed-form memory per stage, beside the planner's: PipeDream's optimizer and the paper's Table 1.

The reviewers asked how petra's memory model compares with what other planners and the paper
itself charge. Both closed forms are evaluated here from the same bytes the planner uses (the
accounting on the meta device, :mod:`petra_core.plan.memory`), per stage, so that a table can set
them side by side (``petra plan answers`` records them; the ``plan`` study renders them):

* **PipeDream** (Narayanan et al., SOSP 2019; ``optimizer/optimizer_graph_hierarchical.py`` of
  msr-fiddle/pipedream, ``compute_partitioning``): a stage that ends after ``n`` of the ``N``
  machines, replicated ``r`` times, is charged ``stashed_data_size = ceil((N - n) / r) x (A + W)``
  against the memory cap: its activations ``A`` and weights ``W`` stashed once per minibatch in
  flight. On a straight pipeline of one device per stage (``r = 1``, ``n = j``, 1-based ``j``)
  that is ``(J - j)(A_j + W_j)``. ``A`` here is what the stage keeps for its backward under delayed
  gradients (its autograd graph and input), ``W`` its weight bytes.
* **The paper's Table 1** (``petra_core/paper_reference.yaml``, its one copy): per method, the
  activations (in stage inputs; ``FG`` = the stage's full graph in stage inputs) and the parameter
  copies of stage ``j``, evaluated here in bytes: activations ``x`` input bytes, params ``x`` weight
  bytes.
* **The planner** (:func:`petra_core.plan.memory.stage_peak_bytes`): what the stage holds at the end
  of a steady tick of the method's own schedule (weights, gradients, optimizer state, minibatches
  in flight x kept bytes, stashed weights, messages in flight), its in-flight count the schedule's.
"""

from __future__ import annotations

import math

from .memory import model_sizes, stage_bytes, stage_peak_bytes, stash_copies

PIPEDREAM_FORMULA = "ceil((N - n) / r) x (A + W); straight pipeline, one device per stage: (J - j)(A_j + W_j)"
PIPEDREAM_SOURCE = "msr-fiddle/pipedream optimizer/optimizer_graph_hierarchical.py, compute_partitioning"
METHODS = ("backprop", "delayed", "dsp", "petra")  # the paper's Table 1 rows that petra runs


def pipedream_stash_bytes(activation_bytes: int, weight_bytes: int, *, machines: int, up_to: int, replicas: int = 1):
    """PipeDream's ``stashed_data_size`` of a stage that ends after ``up_to`` of ``machines``."""
    return math.ceil((machines - up_to) / replicas) * (activation_bytes + weight_bytes)


def paper_terms(method: str, *, J: int, j: int, k: int, input_bytes: int, graph_bytes: int, weight_bytes: int):
    """The paper's Table 1 activations and params of stage ``j`` (1-based) in bytes, and their expressions."""
    from ..reference import evaluate_formula, load_reference

    row = load_reference("paper_table1")["methods"][method]
    names = dict(J=J, j=j, k=k, FG=graph_bytes / input_bytes)
    return dict(
        activations_expr=str(row["activations"]),
        params_expr=str(row["params"]),
        activations_bytes=evaluate_formula(row["activations"], **names) * input_bytes,
        params_bytes=evaluate_formula(row["params"], **names) * weight_bytes,
    )


def memory_terms(arch: str, *, width: int, stem: str, batch: int, num_classes: int, image_size: int, k: int = 1,
                 methods=METHODS) -> list[dict]:  # fmt: skip
    """Per method and stage of ``arch`` (one device per stage): the bytes the closed forms take, the
    paper's terms and PipeDream's charge (delayed gradients only: its method), and the planner's."""
    sizes = model_sizes(arch, width, stem, num_classes, batch, image_size)
    J = len(sizes)
    rows = []
    for method in methods:
        stages = stage_bytes(sizes, method, batch=batch)
        planner = stage_peak_bytes(stages, method, k=k)
        delayed = stage_bytes(sizes, "delayed", batch=batch)  # A of PipeDream: the graph and input it keeps
        for s, (st, raw) in enumerate(zip(stages, sizes, strict=True)):
            graph = raw["graph_bytes"] + raw["input_bytes"]  # FG: what a kept graph holds (memory.stage_bytes)
            terms = paper_terms(method, J=J, j=s + 1, k=k, input_bytes=raw["input_bytes"], graph_bytes=graph,
                                weight_bytes=st["weight_bytes"])  # fmt: skip
            pipedream = (
                pipedream_stash_bytes(delayed[s]["kept_bytes"], st["weight_bytes"], machines=J, up_to=s + 1)
                if method == "delayed"
                else None
            )
            rows.append(
                dict(
                    arch=arch, stem=stem, width=width, batch=batch, k=k, method=method, J=J, stage=s + 1,
                    input_bytes=raw["input_bytes"], graph_bytes=graph, weight_bytes=st["weight_bytes"],
                    kept_bytes=st["kept_bytes"], stash_copies=stash_copies(method, J, s, k), **terms,
                    pipedream_bytes=pipedream, planner_bytes=planner[s],
                )
            )  # fmt: skip
    return rows
