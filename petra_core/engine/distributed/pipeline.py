"""This rank's share of a distributed pipeline: the one runner in a :class:`DistributedWorld`.

Each rank owns a contiguous range of stages (``placement.py``), builds the same model from the
same seed, keeps its stages, and runs them tick by tick with the same runner and per-stage code
as the simulator; only the world differs. Same seed and configuration give the simulator's
weights bit for bit on CPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ...methods import Method
from ...models import StagedModel
from ...optim import Recipe
from ..pipeline import GetBatch, Pipeline, assemble
from ...placement import PlacementSpec
from .failures import DEFAULT_TIMEOUT
from .world import DistributedWorld


class DistributedPipeline(Pipeline):
    """This rank's share of a pipeline over torch.distributed; runs like :class:`Simulator`.

    Every rank constructs it with the same arguments and an identical ``model`` (same seed); it
    keeps the stages ``placement`` gives this rank (see :func:`~petra_core.engine.pipeline.assemble`),
    moves them to ``device`` and runs them tick by tick. ``get_batch`` is only called on rank 0
    (it owns stage 0); other ranks may pass None. Joins the process group from torchrun's
    environment if there is none yet.
    """

    def __init__(self, model: StagedModel, method: str | Method, *, num_batches: int,
                 get_batch: GetBatch | None = None, batch_size: int, k: int = 1, recipe: Recipe = Recipe(),
                 batches_per_epoch: float | None = None, placement: PlacementSpec = "even", measure=None,
                 device: torch.device | str | None = None, timeout: float = DEFAULT_TIMEOUT,
                 sample: tuple[Tensor, Tensor] | None = None, check_same_model: bool = True,
                 sync_timing: bool = False, world: DistributedWorld | None = None):
        world = world if world is not None else DistributedWorld(timeout=timeout, device=device)
        if world.is_main and get_batch is None:
            raise ValueError("rank 0 owns stage 0 and needs get_batch")
        super().__init__(**assemble(model, method, world, num_batches=num_batches, get_batch=get_batch,
                                    batch_size=batch_size, k=k, recipe=recipe, batches_per_epoch=batches_per_epoch,
                                    placement=placement, measure=measure, sample=sample,
                                    check_same_model=check_same_model,
                                    sync_timing=sync_timing))

    @property
    def placement(self) -> list[range]:
        return self.world.placement

    @property
    def stage_costs(self) -> list[float] | None:
        return self.world.stage_costs


@dataclass
class DistributedResult:
    placement: list[range]
    state_dict: dict[str, Tensor] | None  # on rank 0 when gathered
    head_log: list | None  # on rank 0 when gathered
    pipeline: DistributedPipeline


def run_distributed(model: StagedModel, method: str | Method, *, num_batches: int, get_batch: GetBatch | None,
                    batch_size: int, gather: bool = True, **kwargs) -> DistributedResult:
    """Train this rank's share of ``model`` for ``num_batches`` minibatches (pipeline drained,
    partial accumulation flushed). With ``gather``, rank 0 gets the full state_dict and the head's
    log. Raises :class:`PipelineError` on failure (call :func:`fail`
    to exit the process)."""
    pipe = DistributedPipeline(model, method, num_batches=num_batches, get_batch=get_batch, batch_size=batch_size,
                               **kwargs)
    pipe.run()
    if not gather:
        return DistributedResult(pipe.placement, None, None, pipe)
    return DistributedResult(pipe.placement, pipe.gather_state_dict(), pipe.gather_head_log(), pipe)
