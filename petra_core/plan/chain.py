"""The model an emulated point runs (``measure.measure_point``) and the planner sizes (``validate``):
a chain of J stages of RevNet18's parts, so any J is one stage per rank and every method applies."""

from __future__ import annotations

IMAGE_SIZE = 8  # the chain's random images (8 x 8: cheap, so the padding, not the compute, sets the time)


def chain_model(stages: int, width: int = 4):
    """``stages`` stages of RevNet18's parts at ``width``: stem, J − 2 reversible blocks, head
    (seeded; built on the current default device, the meta device for the planner's sizes)."""
    import torch

    from ..families.registry import family_of
    from ..models.blocks import Head, ReversibleBlock, Stem

    torch.manual_seed(0)
    parts = [Stem(2 * width, "cifar", two_streams=True)]
    parts += [ReversibleBlock("basic", width, width) for _ in range(stages - 2)]
    parts.append(Head(2 * width, 10))
    return family_of("revnet18").staged("revnet18-chain", parts)
