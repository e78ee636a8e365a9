"""The steps of :meth:`Pipeline.build <petra_core.engine.pipeline.Pipeline.build>`, in the order it
takes them: the ranks agree on the spec (:func:`agree_on_spec`), rank 0 decides the placement
(:func:`decide_placement`), this process's stages are placed on their devices, one copy of the
model per replica it holds (:func:`place_stages`), and each copy's workers are built complete
(:func:`build_workers`: optimizers, tensor offsets, joined graphs decided beforehand)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from ..methods.prediction import WeightPredictor
from ..models import StagedModel
from ..optim import make_optimizer
from .phases import check_phases, static_storage
from .spec import GetBatch, PipelineSpec
from .worker import StageWorker


@dataclass
class Replica:
    """One replica's copy of the model and the workers of the stages this process holds of it."""

    index: int
    model: StagedModel
    workers: list[StageWorker]


def agree_on_spec(spec: PipelineSpec) -> None:
    """Every rank must describe the same pipeline of the same weights (same seed): one line naming
    the ranks that differ, raised by every rank."""
    world = spec.world
    if world.placement.world_size == 1:
        return
    from .distributed.world import model_fingerprint

    mine = (
        spec.model.arch,
        len(spec.model),
        spec.method.name,
        spec.rule.name,
        str(world.placement.mesh),
        spec.num_batches,
        spec.k,
        spec.batch_size,
        model_fingerprint(spec.model),
    )
    configs = world.ranks.all_objects(mine)
    differ = [r for r, c in enumerate(configs) if c != configs[0]]
    if differ:
        raise ValueError(
            f"ranks disagree on (arch, stages, method, rule, mesh, minibatches, k, batch, weights): "
            f"rank 0 has {configs[0][:-1]}, ranks {differ} differ (same seed on every rank?): "
            + "; ".join(f"rank {r}: {configs[r][:-1]}" for r in differ)
        )


def decide_placement(spec: PipelineSpec) -> tuple[list[range], list[float] | None]:
    """Rank 0's placement of the stages on the pipeline positions, and the stage costs it measured
    for ``balanced`` (None otherwise), shared with every rank; a bad placement is raised by all."""
    from .placement import parse_placement

    world, decision = spec.world, None
    if world.placement.is_main:
        try:
            costs = None
            if spec.placement == "balanced":
                sample = spec.sample if spec.sample is not None else spec.get_batch(0)
                device = world.placement.device_for(0) or next(spec.model.parameters()).device
                costs = spec.measure(spec.model, sample, method=spec.method, device=device)
            decision = (parse_placement(spec.placement, len(spec.model), world.placement.mesh.positions, costs), costs)
        except ValueError as err:  # a bad spec: every rank raises it, none waits for the others
            decision = str(err)
    decision = world.ranks.share(decision)
    if isinstance(decision, str):
        raise ValueError(decision)
    return decision


def place_stages(spec: PipelineSpec, ranges: list[range]) -> dict[int, StagedModel]:
    """Connect the world to ``ranges`` and put this process's stages of each replica it holds on
    their devices: {replica: its copy of the model} (replica 0's, or the first's, is ``spec.model``)."""
    world = spec.world
    world.connect(ranges, spec.schedule, backward=spec.method.gradients_cross)
    models = {r: spec.model if i == 0 else copy.deepcopy(spec.model) for i, r in enumerate(world.placement.replicas)}
    if spec.distinct_inits:  # a population of distinct initialisations
        from ..replicas.population import reinitialise

        for r, m in models.items():
            if r > 0:
                reinitialise(m, spec.rule.seed, r)
    for m in models.values():
        for j in world.placement.stages:
            if world.placement.device_for(j) is not None:
                m[j].to(world.placement.device_for(j))
    return models


def feed_stage_0(get_batch: GetBatch | None, model: StagedModel, stages: range) -> GetBatch | None:
    """``get_batch`` with its images on stage 0's device; labels stay on the (pinned) host until the
    head copies them to its own device (copies.py)."""
    first = next(model[stages.start].parameters()).device
    if get_batch is None or first.type == "cpu":
        return get_batch

    def on_device(mb: int):
        images, labels = get_batch(mb)
        return images.to(first, non_blocking=True), labels

    return on_device


def joined_stages(spec: PipelineSpec, model: StagedModel, storages: dict) -> set[int]:
    """The stages whose next stage may go on through their graph: neighbours of this process on one
    device whose policies both keep the forward's graph on the live weights (``StoragePolicy.joins``:
    backprop's), under a schedule with one minibatch in flight (sequential), where no weight moves
    between a minibatch's forward and its backward. One autograd call per minibatch instead of one
    per stage, with no leaf and no gradient copy at the boundary; the gradients are the same bits
    (tests/test_methods.py). The runner joins only while no observer watches
    (pipeline.run_stage_tick). Several minibatches in flight (GPipe, 1F1B) do not join, although
    their weights stay fixed too: a joined backward reaches the earlier stages at the head's tick,
    ahead of the backward of a minibatch forwarded before a resume (a checkpoint keeps no graph),
    and the gradients would add up in another order."""
    if not spec.schedule.one_in_flight:
        return set()

    def device(j: int) -> torch.device:
        return next(model[j].parameters()).device

    return {
        j
        for j in spec.world.placement.stages
        if j + 1 in storages and device(j) == device(j + 1) and storages[j].joins and storages[j + 1].joins
    }


def calls_of_steps(schedule, stage: int, k: int):
    """The ``warmup_clock="call"`` clock of ``stage``: the call (the last minibatch to have entered
    stage 0, 0-based) of the tick at which the schedule steps the stage for its step s (the backward
    of the step's last minibatch). A pure function of the step: the same in every world and resume."""
    n = schedule.num_batches

    def call_of_step(step: int) -> int:
        tick = schedule.backward_tick(min((step + 1) * k, n) - 1, stage)
        low, high = 0, n - 1  # the last minibatch whose stage-0 forward is at or before the tick
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if schedule.forward_tick(mid, 0) <= tick else (low, mid - 1)
        return low

    return call_of_step


def predictor_of(spec: PipelineSpec, stage, j: int) -> WeightPredictor | None:
    """Stage j's weight predictor (``Method.predicting``): its lag is the optimizer steps between a
    forward and the step its gradient lands in, staleness / k; None where nothing is predicted."""
    lag = spec.schedule.staleness(j) / spec.k
    if not spec.method.weight_prediction or not lag:
        return None
    return WeightPredictor(list(stage.parameters()), alpha=spec.method.weight_prediction, lag=lag)


def build_workers(spec: PipelineSpec, model: StagedModel, replica: int) -> list[StageWorker]:
    """The workers of this process's stages of one replica's ``model`` (already on their devices).
    The learning rate scales with the batch of one optimizer step over all replicas."""
    method, J, stages = spec.method, len(spec.model), spec.world.placement.stages
    batches_per_epoch = spec.batches_per_epoch or max(spec.num_batches, 1)
    policies = method.policies(list(model))  # the whole model's: a bounded rebuild chain is a model-wide choice
    storages = {j: policies[j]() for j in stages}
    if spec.phases != "eager":
        storages = {j: static_storage(policy, last=j == J - 1) for j, policy in storages.items()}
    joins = joined_stages(spec, model, storages)
    # each stage's first parameter tensor in network order, and their number (rules such as wash
    # treat tensors by depth)
    counts = [sum(1 for _ in model[j].parameters()) for j in range(J)]
    workers = []
    for j in stages:
        opt, sched = make_optimizer(
            model[j],
            spec.recipe,
            batch_size=spec.batch_size * spec.replicas,
            k=spec.k,
            steps_per_epoch=batches_per_epoch / spec.k,
            call_of_step=calls_of_steps(spec.schedule, j, spec.k) if spec.recipe.warmup_clock == "call" else None,
        )
        workers.append(
            StageWorker(
                model[j],
                j,
                J,
                storages[j],
                opt,
                sched,
                k=spec.k,
                send_input_back=j > 0 and policies[j - 1].needs_output_back,
                replica=replica,
                precision=spec.precision,
                tensor_offset=sum(counts[:j]),
                tensors_total=sum(counts),
                joins_next=j in joins,
                batches_per_epoch=batches_per_epoch,
                predictor=predictor_of(spec, model[j], j),
            )
        )
    if spec.phases != "eager":
        for worker in workers:
            check_phases(spec.phases, method, replicas=spec.replicas, device=worker.device)
            worker.run_static(graphs=spec.phases == "graphs")
    return workers
