"""How far PETRA's reconstructed inputs drift from the true ones, per stage and numeric precision.

In PETRA a reversible stage rebuilds its input from its output, x̂ = F⁻¹(y), with its current
weights, and hands x̂ down to the previous stage, which rebuilds its own input from it: errors
compound along a run of consecutive reversible stages, until a stage that keeps its input (the
stem, a downsampling stage, the head) starts the chain afresh from an exact value.
:func:`reconstruction_errors` runs a forward pass under a precision, keeps every stage's true
input, then rebuilds down the chain under the same precision and reports, per reversible stage,
the relative error ‖x̂ − x‖ / ‖x‖ and the largest elementwise error relative to max |x|.

Precisions: those a run trains at (:mod:`petra_core.precision`): ``fp32``, ``tf32`` (TF32
matmuls and convolutions on CUDA; fp32 on a CPU), ``bf16`` (autocast to bfloat16).

``messages``: ``"float32"`` (what training does: every stage's output, and every rebuilt input,
is widened to float32 before the next stage sees it) or ``"native"`` (left in whatever dtype
autocast produced, i.e. bf16 activations between stages: the contrast that shows why training
widens them — a coupling x̃ + F(x) computed in bf16 rounds away what its inverse needs).
"""

from __future__ import annotations

import torch

from ..models import streams
from ..precision import PRECISIONS, precision_scope, widen  # noqa: F401 (PRECISIONS: for callers)

MESSAGES = ("float32", "native")


@torch.no_grad()
def reconstruction_errors(model, x: torch.Tensor, name: str, messages: str = "float32") -> list[dict]:
    """Per stage (train mode: batch statistics, as PETRA's reconstruction runs): kind, whether it
    rebuilds its input, the chain position, and the relative errors of the rebuilt input."""
    if messages not in MESSAGES:
        raise ValueError(f"messages {messages!r} is not allowed; allowed: {', '.join(MESSAGES)}")
    sent = (lambda a: streams.apply(widen, a)) if messages == "float32" else (lambda a: a)
    device = x.device
    model.train()
    inputs = []
    with precision_scope(name, device):
        h = x
        for stage in model:
            inputs.append(h)  # what the stage receives, as it was sent
            h = sent(stage(h))
        rows = []
        rebuilt = None  # what the next stage handed down (None: the next stage kept its input)
        depth = 0
        for j in reversed(range(len(model))):
            stage = model[j]
            if not stage.reversible:
                rows.append(
                    {"stage": j, "kind": stage.kind, "rebuilds": False, "chain": 0, "rel_error": 0.0, "max_error": 0.0}
                )
                rebuilt, depth = None, 0
                continue
            y = sent(stage(inputs[j])) if rebuilt is None else rebuilt  # the exact output, or the one handed down
            x_hat = sent(stage.inverse(y))
            got, true = streams.join(x_hat).float(), streams.join(inputs[j]).float()
            depth += 1
            rows.append(
                {
                    "stage": j,
                    "kind": stage.kind,
                    "rebuilds": True,
                    "chain": depth,
                    "rel_error": float((got - true).norm() / true.norm()),
                    "max_error": float((got - true).abs().max() / true.abs().max()),
                }
            )
            rebuilt = x_hat
    for r in rows:
        r["precision"], r["messages"] = name, messages
    return sorted(rows, key=lambda r: r["stage"])
