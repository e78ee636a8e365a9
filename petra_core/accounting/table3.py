"""Table 3 (memory of RevNet50 on ImageNet, batch 64, k = 1): the paper's formula and real shapes.

Conventions of the paper's formula (docs/architecture.md, "Table 3 memory formula"): float32,
GB = 1e9 bytes; staleness of 1-based stage j is 2(J - j); model memory = sum over stages of
(parameters + batch-norm buffers + one input activation); input buffer = stage input x staleness
for every stage when inputs are stored (rows 1-2, the stem's image buffer included), for
downsampling stages only otherwise (rows 3-4); parameter buffer = parameters x
ceil(staleness / k); stage inputs at one stream's width except stem and downsampling stages.
Every size comes from the real model by shape propagation (:func:`stage_shapes`).
"""

from __future__ import annotations

import math

import torch

from ..families import build_model
from ..methods.schedule import staleness
from ..reference import load_reference
from .shapes import FLOAT32, stage_shapes

GB = 1e9
ROWS = ((True, True), (True, False), (False, True), (False, False))  # (input buffer, param buffer)

# accounting variants: (input sizes, parameter column, rows whose input buffers include the stem's images)
VARIANTS = {
    "formula": ("input_numel_paper", "params", "rows12"),  # the paper's formula, our parameter count
    "formula_conv_bias": ("input_numel_paper", "params_with_conv_bias", "rows12"),  # authors' count
    "real": ("input_numel", "params", "rows12"),  # every buffered tensor at its real shape
    "real_no_stem": ("input_numel", "params", "never"),  # real shapes, image buffer never counted
    "real_engine": ("input_numel", "params", "always"),  # real shapes, stem buffers images (our engine)
}


def memory_components(
    shapes: list[dict], *, input_buffer: bool, param_buffer: bool, k: int = 1, variant: str = "formula"
) -> dict[str, float]:
    """Bytes of (model, input buffers, parameter buffers) for one row of Table 3."""
    size, pcol, stem_rule = VARIANTS[variant]
    J = len(shapes)
    model = sum(FLOAT32 * (r[pcol] + r[size]) + r["bn_buffer_bytes"] for r in shapes)
    inputs = 0
    for r in shapes:
        if r["kind"] == "S":
            buffered = stem_rule == "always" or (stem_rule == "rows12" and input_buffer)
        else:
            buffered = input_buffer or r["kind"] == "D"
        if buffered:
            inputs += FLOAT32 * r[size] * staleness(J, r["stage"])
    params = sum(FLOAT32 * r[pcol] * math.ceil(staleness(J, r["stage"]) / k) for r in shapes) if param_buffer else 0
    return dict(
        model_bytes=model, input_buffer_bytes=inputs, param_buffer_bytes=params, memory_bytes=model + inputs + params
    )


def table3(
    *,
    arch: str | None = None,
    batch: int | None = None,
    k: int | None = None,
    image_size: int | None = None,
    stem: str | None = None,
) -> list[dict]:
    """Tidy rows of Table 3: one per (row, accounting). Defaults are the paper's configuration.

    accounting: ``paper`` (the published value), ``formula`` (the paper's formula re-implemented),
    ``formula_conv_bias`` (same, with the authors' conv biases), ``real`` (every buffered tensor at
    its real shape: a reversible stage's input is both streams), ``real_no_stem`` (real shapes and
    the image buffer never counted, as the paper's caption says), ``real_engine`` (real shapes, the
    stem buffers its images in every row, as this project's engine does). saving_pct is vs row 1.
    """
    ref = load_reference("paper_table3")
    arch, batch, k = arch or ref["arch"], batch or ref["batch"], k or ref["k"]
    image_size, stem = image_size or ref["image_size"], stem or ref["stem"]
    with torch.device("meta"):
        model = build_model(arch, num_classes=ref["num_classes"], stem=stem)
    shapes = stage_shapes(model, batch=batch, image_size=image_size)
    rows = []
    for i, (ib, pb) in enumerate(ROWS, start=1):
        paper = ref["rows"][i - 1]
        assert (paper["input_buffer"], paper["param_buffer"]) == (ib, pb)
        rows.append(
            dict(
                row=i,
                input_buffer=ib,
                param_buffer=pb,
                accounting="paper",
                memory_gb=paper["memory_gb"],
                saving_pct=paper["saving_pct"],
            )
        )
        for variant in VARIANTS:
            parts = memory_components(shapes, input_buffer=ib, param_buffer=pb, k=k, variant=variant)
            rows.append(
                dict(
                    row=i,
                    input_buffer=ib,
                    param_buffer=pb,
                    accounting=variant,
                    **{key.replace("_bytes", "_gb"): v / GB for key, v in parts.items()},
                )
            )
    for acc in {r["accounting"] for r in rows} - {"paper"}:
        first = next(r["memory_gb"] for r in rows if r["accounting"] == acc and r["row"] == 1)
        for r in rows:
            if r["accounting"] == acc:
                r["saving_pct"] = 100 * (1 - r["memory_gb"] / first)
    for r in rows:
        r.update(arch=arch, batch=batch, k=k, image_size=image_size, num_stages=len(shapes))
    return rows
