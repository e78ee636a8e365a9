"""Stage sizes from the real model by shape propagation on the meta device (no compute, no lists).

One row per stage: kind, input/output shapes, parameter and batch-norm buffer counts, and the
sizes the memory accounting needs: the stage input as it really is (a RevNet activation is both
streams) and as the paper lists it (one stream, except stem and downsampling stages). The input
is the model family's sample (``ModelFamily.sample_input``), so any family's model can be sized.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from ..models import StagedModel, streams

FLOAT32 = 4  # bytes per element; the paper's accounting is float32 throughout


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def conv_bias_params(module: nn.Module) -> int:
    """Parameters that biases on every bias-free convolution would add (the authors' convs have them)."""
    return sum(m.out_channels for m in module.modules() if isinstance(m, nn.Conv2d) and m.bias is None)


def stage_shapes(model: StagedModel, *, batch: int, **input_options) -> list[dict]:
    """Propagate the family's sample input of ``batch`` samples (``input_options``, e.g. an image
    family's ``image_size``) through a meta copy of ``model``.

    Columns: stage (0-based), kind, reversible, input_shape, output_shape, input_numel,
    input_numel_paper (one stream unless stem/downsampling), output_numel, params,
    params_with_conv_bias, bn_buffer_bytes (running mean/var and counters, at their dtypes).
    """
    meta = copy.deepcopy(model).to("meta") if next(model.parameters()).device.type != "meta" else model
    two_streams = bool(model.reversible_stages)  # a reversible model's activations are two streams
    rows, x = [], model.family.sample_input(batch, device="meta", **input_options)
    with torch.no_grad():
        for j, stage in enumerate(meta):
            y = stage(x)
            in_numel = _numel(streams.shape(x))
            one_stream = two_streams and stage.kind not in ("S", "D")
            rows.append(
                dict(
                    stage=j,
                    kind=stage.kind,
                    reversible=stage.reversible,
                    input_shape=streams.shape(x),
                    output_shape=streams.shape(y),
                    input_numel=in_numel,
                    input_numel_paper=in_numel // 2 if one_stream else in_numel,
                    output_numel=_numel(streams.shape(y)),
                    params=sum(p.numel() for p in stage.parameters()),
                    params_with_conv_bias=sum(p.numel() for p in stage.parameters()) + conv_bias_params(stage),
                    bn_buffer_bytes=sum(b.numel() * b.element_size() for b in stage.buffers()),
                )
            )
            x = y
    return rows
