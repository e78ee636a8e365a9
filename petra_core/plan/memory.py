"""Bytes per stage and peak memory per device, from the accounting's shapes on the meta device.

Per stage (:func:`model_sizes`, then :func:`stage_bytes` under a method; no compute: shapes
propagated on the meta device, so a RevNet50 at any width is sized in milliseconds): weights,
gradients, optimizer state (one momentum buffer per parameter), the bytes kept per minibatch in
flight under the method's storage policy, and the forward and backward messages. What a policy keeps:

* ``input`` (DSP, PETRA's non-reversible stages): the stage's input, exact from its shape, less
  the stream it shares with the previous stage's buffer (as ``accounting/memory.py`` counts it);
* nothing (PETRA's reversible stages): 0;
* ``graph`` (backprop, delayed, GPipe, 1F1B): the forward's saved tensors, counted with autograd's
  saved-tensor hooks on the meta device (parameters excluded), plus the input: an estimate
  (docs/planning.md gives its error against the measured Table 1 bytes);
* ``weight_stash`` (delayed): ceil(staleness / k) copies of the weights (``paper_reference`` Table 1).

Peak per device (:func:`device_peak_bytes`) = per stage it holds: weights + gradients + optimizer
+ in_flight × kept + stashed weights + its messages in flight; plus the largest
working set among its stages (input, output and the graph a forward or rebuild builds, held while
the stage computes). in_flight is the schedule's own count (``Schedule.in_flight``). A profile
measured with ``petra plan profile`` carries measured kept bytes instead of the estimate.
"""

from __future__ import annotations

import math
from functools import lru_cache

FLOAT32 = 4
LABEL_BYTES = 8


def meta_model(arch: str, *, width: int = 64, stem: str = "cifar", num_classes: int = 10):
    """The model on the meta device (no memory, no compute)."""
    import torch

    from ..families import build_model

    with torch.device("meta"):
        return build_model(arch, num_classes=num_classes, stem=stem, width=width)


def graph_bytes(stage, x, *, first: bool) -> tuple[int, object]:
    """Bytes the forward of ``stage`` on ``x`` saves for its backward (parameters excluded), and its output."""
    import torch

    from ..models import streams

    params = {id(p) for p in stage.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        if id(t) not in params:
            saved[id(t)] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = stage(x if first else streams.leaves(x, True))
    return sum(saved.values()), streams.apply(torch.Tensor.detach, y)


def raw_sizes(model, *, batch: int, image_size: int) -> list[dict]:
    """Per stage, what no method changes: kind, reversible, input, output and graph bytes, parameter bytes."""
    import torch

    from ..models import streams

    x = model.family.sample_input(batch, device="meta", image_size=image_size)
    rows = []
    for j, stage in enumerate(model):
        graph, y = graph_bytes(stage, x, first=j == 0)
        rows.append(
            dict(
                kind=stage.kind,
                reversible=stage.reversible,
                input_bytes=FLOAT32 * math.prod(streams.shape(x)),
                output_bytes=FLOAT32 * math.prod(streams.shape(y)),
                graph_bytes=graph,
                params_bytes=FLOAT32 * sum(p.numel() for p in stage.parameters()),
            )
        )
        x = streams.apply(torch.Tensor.detach, y)
    return rows


@lru_cache(maxsize=256)
def model_sizes(arch: str, width: int, stem: str, num_classes: int, batch: int, image_size: int) -> tuple:
    """:func:`raw_sizes` of a model built on the meta device (cached: a search asks each method)."""
    model = meta_model(arch, width=width, stem=stem, num_classes=num_classes)
    return tuple(raw_sizes(model, batch=batch, image_size=image_size))


def stage_bytes(sizes, method: str, *, batch: int, momentum: bool = True) -> list[dict]:
    """One dict per stage, from its :func:`raw_sizes` under ``method``'s policies: weight_bytes,
    grad_bytes, optimizer_bytes, kept_bytes (per minibatch in flight, stash apart),
    forward_message_bytes, backward_message_bytes, input_bytes, work_bytes (held only while the
    stage computes), keeps."""
    from types import SimpleNamespace

    from ..methods import get_method

    m = get_method(method)
    J = len(sizes)
    policies = m.policies([SimpleNamespace(reversible=r["reversible"]) for r in sizes])
    rows = []
    for j, r in enumerate(sizes):
        in_bytes, out_bytes, graph, params = r["input_bytes"], r["output_bytes"], r["graph_bytes"], r["params_bytes"]
        keeps = policies[j].keeps
        kept = (in_bytes if "input" in keeps else 0) + (graph + in_bytes if "graph" in keeps else 0)
        # while it computes: its input, its output, and the graph a forward or rebuild builds unless kept
        work = in_bytes + out_bytes + (0 if "graph" in keeps and j < J - 1 else graph)
        needs_output = j > 0 and policies[j - 1].needs_output_back
        # what accounting/memory.py's shared_stream counts: a coupling (x, x~) -> (x~ + F(x), x) passes its
        # input's first stream on as its output's second; where both it and the next stage buffer inputs,
        # the next stage's buffered inputs hold that stream once, and so does its message in flight
        if "input" in keeps and j > 0 and sizes[j - 1]["kind"] == "R" and "input" in policies[j - 1].keeps:
            kept -= in_bytes // 2
        shared = out_bytes // 2 if r["kind"] == "R" and "input" in keeps and j < J - 1 else 0
        # a kept graph's input is the previous stage's output, which its kept graph saved (one device)
        joint = in_bytes if "graph" in keeps and j > 0 and j < J - 1 and "graph" in policies[j - 1].keeps else 0
        rows.append(
            dict(
                stage=j,
                kind=r["kind"],
                keeps=list(keeps),
                weight_bytes=params,
                grad_bytes=params,
                optimizer_bytes=params if momentum else 0,
                kept_bytes=0 if j == J - 1 else kept,  # the head runs forward and backward in one tick
                forward_message_bytes=out_bytes + LABEL_BYTES * batch if j < J - 1 else 0,
                backward_message_bytes=in_bytes * (2 if needs_output else 1) if j > 0 and m.gradients_cross else 0,
                input_bytes=in_bytes,
                work_bytes=work,
                shared_bytes=shared,
                joint_bytes=joint,
            )
        )
    return rows


def stash_copies(method: str, num_stages: int, stage: int, k: int) -> int:
    """Stashed weight versions a stage holds at steady state (delayed gradients: ceil(staleness / k))."""
    from ..methods import get_method

    m = get_method(method)
    if m.schedule.fixed_weights_in_flight or stage == num_stages - 1:
        return 0
    stashes = "weight_stash" in m.other.keeps or "weight_stash" in m.reversible.keeps
    return math.ceil(m.schedule(num_stages, 1, k=k).staleness(stage) / k) if stashes else 0


def _get(s, name: str) -> int:
    return s[name] if isinstance(s, dict) else getattr(s, name)


def stage_held_bytes(stages, method: str, *, k: int = 1) -> list[int]:
    """What each stage holds at the end of a steady tick besides its weights and gradients
    (``stages``: :class:`StageProfile` s or their dicts): optimizer state + in_flight × kept +
    stashed weights, less what is shared, plus the messages it has sent and that are not yet
    consumed (a pipeline: one activation up and one gradient down; one minibatch in flight: they
    are counted once per device, :func:`device_peak_bytes`)."""
    from ..methods import get_method

    J = len(stages)
    m = get_method(method)
    schedule = m.schedule(J, 1 << 20, k=k)
    out = []
    for j, s in enumerate(stages):
        n = schedule.in_flight(j)
        held = (
            _get(s, "optimizer_bytes")
            + n * _get(s, "kept_bytes")
            + stash_copies(method, J, j, k) * _get(s, "weight_bytes")
        )
        held -= _get(s, "shared_bytes") if n else 0
        if not m.schedule.one_in_flight:
            held += _get(s, "forward_message_bytes") + _get(s, "backward_message_bytes")
        out.append(held)
    return out


def stage_peak_bytes(stages, method: str, *, k: int = 1) -> list[int]:
    """Bytes each stage holds at steady state: weights + gradients + :func:`stage_held_bytes`."""
    held = stage_held_bytes(stages, method, k=k)
    return [h + _get(s, "weight_bytes") + _get(s, "grad_bytes") for h, s in zip(held, stages, strict=True)]


def device_held_bytes(stages, method: str, placement, *, k: int = 1) -> list[int]:
    """Per device, :func:`stage_held_bytes` of its stages, less what two of its consecutive stages'
    kept graphs hold once (``joint_bytes``: on one device a stage's input is its neighbour's output)."""
    from ..methods import get_method

    held = stage_held_bytes(stages, method, k=k)
    schedule = get_method(method).schedule(len(stages), 1 << 20, k=k)
    return [
        sum(held[j] for j in r) - sum(schedule.in_flight(j) * _get(stages[j], "joint_bytes") for j in r[1:])
        for r in placement
    ]


def device_peak_bytes(stages, method: str, placement, *, k: int = 1) -> list[int]:
    """Peak bytes per device (``placement``: a range of stages per device): its stages' weights and
    gradients, what they hold (:func:`device_held_bytes`; one minibatch in flight: its largest
    message), and the largest working set among them."""
    from ..methods import get_method

    held = device_held_bytes(stages, method, placement, k=k)
    one = get_method(method).schedule.one_in_flight
    out = []
    for r, h in zip(placement, held, strict=True):
        resident = sum(_get(stages[j], "weight_bytes") + _get(stages[j], "grad_bytes") for j in r)
        sent = max(_get(stages[j], "forward_message_bytes") + _get(stages[j], "backward_message_bytes") for j in r)
        out.append(resident + h + (sent if one else 0) + max(_get(stages[j], "work_bytes") for j in r))
    return out
