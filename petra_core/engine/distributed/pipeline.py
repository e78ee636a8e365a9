"""This rank's share of a distributed pipeline: the one runner in a :class:`DistributedWorld`."""

from __future__ import annotations

import torch

from ...methods import Method
from ...models import StagedModel
from ..assembly import assemble
from ..pipeline import Pipeline
from .failures import DEFAULT_TIMEOUT
from .world import DistributedWorld


class DistributedPipeline(Pipeline):
    """This rank's share of a pipeline over torch.distributed; runs like :class:`Simulator`. Every rank
    passes the same arguments of :func:`~petra_core.engine.pipeline.assemble` (``num_batches``,
    ``get_batch`` (used on rank 0), ``batch_size``, ``k``, ``recipe``, ``placement``, ...) and an
    identical ``model``; the process group must exist (:func:`petra_core.engine.launch.init_distributed`)."""

    def __init__(
        self,
        model: StagedModel,
        method: str | Method,
        *,
        device: torch.device | str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        replicas: int = 1,
        world: DistributedWorld | None = None,
        **kwargs,
    ):
        world = world if world is not None else DistributedWorld(device, timeout=timeout, replicas=replicas)
        if world.placement.position == 0 and kwargs.get("get_batch") is None:
            raise ValueError(f"{world.placement.describe()} owns stage 0 of its replica and needs get_batch")
        super().__init__(**assemble(model, method, world, **kwargs))
