"""Memory of a running method: the real-shape prediction and the measurement, side by side.

The prediction is the Table 3 accounting at real shapes, applied to what the engine holds at the
end of a steady-state tick of the pipelined schedule (every stage busy in both directions):

* input buffer of stage j = staleness_j stage inputs, if its policy buffers inputs;
* weight stash of stage j = one copy of its parameters per distinct weight version among its
  in-flight minibatches (ceil(staleness_j / k) once the stage has stepped for long enough: from
  tick 4(J-1) on every stage, with k = 1), if it stashes;
* graph of stage j = staleness_j kept graphs (not predictable from shapes: measured per minibatch);
* in flight in the transport: one forward message per stage (activation + labels) and one backward
  message per stage (gradient, + activation when the receiver rebuilds its input);
* less what is shared: a coupling (x, x̃) -> (x̃ + F(x), x) passes its input's first stream on as
  its output's second, the same tensor. Where it buffers its inputs, its forward message in flight
  and the buffered inputs of the next stage (if that stage buffers too: it keeps a subset of the
  same minibatches) hold that stream once, already counted (``shared_stream``, negative);
* optimizer state: one momentum buffer per parameter.

The measurement runs the simulator to such a tick under an :class:`AllocationMeter` (everything
the run allocated and still holds) and walks what the policies hold (:func:`held_by_stage`).
"""

from __future__ import annotations

import torch

from ..engine import Simulator
from ..methods import get_method
from ..methods.schedule import Schedule, fill_drain
from ..models import StagedModel
from ..optim import Recipe
from .held import AllocationMeter, held_by_stage, held_total
from .shapes import FLOAT32, stage_shapes

LABEL_BYTES = 8  # int64 class labels


def stash_versions(schedule: Schedule, stage: int, tick: int) -> int:
    """Distinct weight versions among a stage's in-flight minibatches at the end of ``tick`` of a
    pipelined ``schedule`` (one backward a tick once the stage has started backwards).

    The forward of tick tau uses version floor(backwards done before tau / k); the in-flight
    minibatches were forwarded at ticks tick - staleness + 1 .. tick.
    """
    first_backward = schedule.backward_tick(0, stage)
    taus = range(tick - schedule.staleness(stage) + 1, tick + 1)
    return len({max(0, tau - first_backward) // schedule.k for tau in taus})


def predict_steady_state(
    model: StagedModel,
    method: str,
    *,
    batch: int,
    image_size: int,
    k: int = 1,
    tick: int | None = None,
    momentum: bool = True,
) -> list[dict]:
    """Tidy rows (stage, kind, component, bytes) held at the end of pipelined tick ``tick``.

    ``tick`` (0-based, default 4(J-1)) must have every stage busy in both directions:
    tick >= 2(J-1), with minibatches still entering the pipeline.
    """
    m = get_method(method)
    if m.schedule.fixed_weights_in_flight:
        raise ValueError(
            f"steady state is defined for schedules whose weights move in flight (pipelined); {method!r} is "
            f"{m.schedule.name}"
        )
    shapes = stage_shapes(model, batch=batch, image_size=image_size)
    J = len(shapes)
    tick = 2 * fill_drain(J) if tick is None else tick
    if tick < fill_drain(J):
        raise ValueError(f"tick {tick} is before the steady state (tick >= {fill_drain(J)})")
    schedule = m.schedule(J, tick + 1, k=k)
    policies = m.policies(list(model))
    rows = []
    for j, r in enumerate(shapes):
        previous = (shapes[j - 1]["kind"], policies[j - 1]) if j > 0 else None
        rows += _stage_rows(r, policies[j], previous, schedule, tick, batch, momentum)
    return rows


def _stage_rows(r: dict, policy, previous, schedule: Schedule, tick: int, batch: int, momentum: bool) -> list[dict]:
    """The rows of one stage (``r``: its shapes; ``previous``: the previous stage's kind and policy)."""
    rows = []
    j, J = r["stage"], schedule.num_stages

    def add(component, n):
        rows.append(dict(stage=j, kind=r["kind"], component=component, bytes=n))

    s = schedule.staleness(j)
    x = FLOAT32 * r["input_numel"]
    if "input" in policy.keeps:
        add("input_buffer", s * x)
        if previous is not None and previous[0] == "R" and "input" in previous[1].keeps:
            add("shared_stream", -s * x // 2)  # each buffered input's second stream: stage j-1's
    if r["kind"] == "R" and "input" in policy.keeps and j < J - 1:
        add("shared_stream", -FLOAT32 * r["output_numel"] // 2)  # the message's second stream: buffered here
    if "weight_stash" in policy.keeps:
        add("weight_stash", stash_versions(schedule, j, tick) * FLOAT32 * r["params"])
    if "graph" in policy.keeps and j < J - 1:
        add("graph", None)  # depends on the layers' saved tensors: not predictable from shapes
    if j < J - 1:
        add("forward_message", FLOAT32 * r["output_numel"] + LABEL_BYTES * batch)
    if j > 0:
        add("backward_message", x * (2 if previous[1].needs_output_back else 1))
    if momentum:
        add("optimizer_state", FLOAT32 * r["params"])
    return rows


def measure_steady_state(
    model: StagedModel,
    method: str,
    *,
    batch: int,
    image_size: int,
    k: int = 1,
    tick: int | None = None,
    num_classes: int = 10,
    seed: int = 0,
    recipe: Recipe = Recipe(weight_decay=0.0),
) -> dict:
    """Run ``method`` to the end of ``tick`` (default 4(J-1)) and compare memory with the prediction.

    Minibatches are generated inside the run (so the stem's buffered images count as allocated).
    Returns allocated_bytes (allocator), held_bytes (policies, distinct storages), predicted_bytes
    (sum of :func:`predict_steady_state`), predicted_buffer_bytes, held_by_stage rows and the
    prediction rows.
    """
    J = len(model)
    gen = torch.Generator().manual_seed(seed)

    def get_batch(mb):
        return (
            torch.randn(batch, 3, image_size, image_size, generator=gen),
            torch.randint(0, num_classes, (batch,), generator=gen),
        )

    tick = 2 * fill_drain(J) if tick is None else tick  # every stage busy, weight stashes at their steady count
    sim = Simulator(model, method, num_batches=tick + 2, get_batch=get_batch, batch_size=batch, k=k, recipe=recipe)
    with AllocationMeter() as meter:
        sim.run(ticks=tick + 1)
    predicted = predict_steady_state(
        model, method, batch=batch, image_size=image_size, k=k, tick=tick, momentum=recipe.momentum > 0
    )
    buffers = ("input_buffer", "weight_stash", "graph")

    def total(rows):
        values = [r["bytes"] for r in rows]
        return None if any(v is None for v in values) else sum(values)

    return dict(
        method=method,
        arch=model.arch,
        batch=batch,
        image_size=image_size,
        k=k,
        tick=sim.tick - 1,
        allocated_bytes=meter.net_bytes,
        held_bytes=held_total(sim.workers),
        predicted_bytes=total(predicted),  # None where a kept graph makes it unpredictable
        predicted_buffer_bytes=total([r for r in predicted if r["component"] in buffers]),
        held_by_stage=held_by_stage(sim.workers),
        predicted=predicted,
    )
