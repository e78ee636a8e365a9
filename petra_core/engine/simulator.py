"""The single-process simulator: the :class:`~petra_core.engine.pipeline.Pipeline` of every replica
and stage in a :class:`~petra_core.engine.worlds.LocalWorld` (in-process FIFOs; the same per-stage
code). Two conveniences over :meth:`Pipeline.build`, for tests, notebooks and the README."""

from __future__ import annotations

from ..methods import Method
from ..models import StagedModel
from ..optim import Recipe
from ..replicas import ReplicaRule
from .pipeline import Pipeline
from .spec import GetBatch, PipelineSpec
from .worlds import LocalWorld


def Simulator(  # named as the class it once was: its callers read it as a constructor
    model: StagedModel,
    method: str | Method,
    *,
    num_batches: int,
    get_batch: GetBatch,
    batch_size: int,
    k: int = 1,
    recipe: Recipe = Recipe(),
    batches_per_epoch: float | None = None,
    replicas: int = 1,
    rule: str | ReplicaRule | None = None,
    offset: int = 0,
    world: LocalWorld | None = None,
) -> Pipeline:
    """The pipeline of ``method`` on ``model`` for ``num_batches`` minibatches per replica given by
    ``get_batch(mb)`` (replica r's t-th is ``get_batch(t * replicas + r)``). The pipeline is drained
    at the end; a final partial accumulation group is applied as its mean. ``replicas`` copies of
    the pipeline combine their stages' gradients by ``rule`` (default ``dp``); with ``offset``,
    replica r runs its schedule ``offset * r`` ticks after replica 0 (cyclic execution). ``world``:
    a :class:`LocalWorld` of ``replicas`` to use (one that measures, say)."""
    return Pipeline.build(
        PipelineSpec(
            model=model,
            method=method,
            recipe=recipe,
            num_batches=num_batches,
            k=k,
            offset=offset,
            rule=rule,
            world=world if world is not None else LocalWorld(replicas=replicas),
            get_batch=get_batch,
            batch_size=batch_size,
            batches_per_epoch=batches_per_epoch,
        )
    )


def simulate(
    model: StagedModel,
    method: str | Method,
    batches,
    *,
    k: int = 1,
    recipe: Recipe = Recipe(),
    batches_per_epoch: float | None = None,
    replicas: int = 1,
    rule: str | ReplicaRule | None = None,
) -> Pipeline:
    """Train ``model`` in place with ``method`` on a list of (images, labels) minibatches (with
    ``replicas``, shared out in turn: each replica trains on len(batches) // replicas of them)."""
    batches = list(batches)
    if len(batches) < replicas:
        raise ValueError(f"simulate needs at least one minibatch per replica, got {len(batches)} for {replicas}")
    return Simulator(
        model,
        method,
        num_batches=len(batches) // replicas,
        get_batch=batches.__getitem__,
        batch_size=len(batches[0][1]),
        k=k,
        recipe=recipe,
        batches_per_epoch=batches_per_epoch,
        replicas=replicas,
        rule=rule,
    ).run()
