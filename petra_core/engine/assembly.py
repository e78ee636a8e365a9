"""How a :class:`~petra_core.engine.pipeline.Pipeline` is put together: the workers of every
replica this process holds, on their devices, with their optimizers, after the ranks have agreed
on the model and the placement: ``Pipeline(**assemble(model, method, world, ...))``."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from ..methods import Method, check_method_fits, get_method
from ..methods.schedule import Schedule
from ..models import StagedModel
from ..optim import Recipe, make_optimizer
from ..replicas import ReplicaRule, get_rule
from .worker import StageWorker

GetBatch = Callable[[int], tuple[Tensor, Tensor]]  # minibatch id of the run's stream -> (images, labels)


def check_k(k: object) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"accumulation k must be an integer >= 1, got {k!r}")
    return k


def schedule_for(method: str | Method, num_stages: int, num_batches: int, k: int = 1) -> Schedule:
    return get_method(method).schedule(num_stages, num_batches, k=k)


def build_workers(
    model: StagedModel,
    method: str | Method,
    *,
    k: int = 1,
    recipe: Recipe = Recipe(),
    batch_size: int,
    batches_per_epoch: float,
    stages: range | None = None,
    replica: int = 0,
    precision: str = "fp32",
) -> list[StageWorker]:
    """One worker per stage (or per stage in ``stages``, for a rank of a distributed run) of one
    replica's ``model``. Stages must already be on their devices. ``batch_size`` is what the
    learning rate scales with: the batch of one optimizer step over all replicas."""
    method = get_method(method)
    check_method_fits(method, model)
    k = check_k(k)
    J = len(model)
    # each stage's first parameter tensor in network order, and their number (rules such as wash
    # treat tensors by depth)
    counts = [sum(1 for _ in model[j].parameters()) for j in range(J)]
    workers = []
    for j in stages if stages is not None else range(J):
        opt, sched = make_optimizer(model[j], recipe, batch_size=batch_size, k=k, steps_per_epoch=batches_per_epoch / k)
        send_back = j > 0 and method.policy_for(model[j - 1], last=False).needs_output_back
        workers.append(
            StageWorker(
                model[j],
                j,
                J,
                method.storage_for(model[j], last=j == J - 1),
                opt,
                sched,
                k=k,
                send_input_back=send_back,
                replica=replica,
                precision=precision,
            )
        )
        workers[-1].tensor_offset, workers[-1].tensors_total = sum(counts[:j]), sum(counts)
    join_graphs(workers, method.schedule)
    return workers


def join_graphs(workers: list[StageWorker], schedule: type[Schedule]) -> None:
    """Let neighbouring stages share one autograd graph where nothing can tell the difference.

    Under the sequential schedule no weight moves between a minibatch's forward and its backward,
    and one minibatch is in flight.
    Two consecutive stages of this process on one device whose policies both keep their forward's
    graph on the live weights (``StoragePolicy.joins``: backprop's) may then be one graph: the
    first hands its output on attached, and the later stage's backward runs on through it. That
    is one autograd call per minibatch instead of one per stage, with no leaf and no gradient copy
    at the boundary; the gradients are the same bits (tests/test_methods.py). The runner joins
    only while no observer watches (pipeline.run_stage_tick). Several minibatches in flight (GPipe,
    1F1B) do not join, although their weights stay fixed too: a joined backward reaches the earlier
    stages at the head's tick, ahead of the backward of a minibatch forwarded before a resume (a
    checkpoint keeps no graph), and the gradients would add up in another order."""
    if not schedule.one_in_flight:
        return
    for a, b in zip(workers, workers[1:]):
        a.joins_next = a.device == b.device and a.storage.joins and b.storage.joins  # workers of a range of stages


@dataclass
class Replica:
    """One replica's copy of the model and the workers of the stages this process holds of it."""

    index: int
    model: StagedModel
    workers: list[StageWorker]


def assemble(
    model: StagedModel,
    method: str | Method,
    world,
    *,
    num_batches: int,
    get_batch: GetBatch | None,
    batch_size: int,
    k: int = 1,
    recipe: Recipe = Recipe(),
    batches_per_epoch: float | None = None,
    placement="even",
    measure: Callable | None = None,
    sample: tuple[Tensor, Tensor] | None = None,
    sync_timing: bool = False,
    rule: str | ReplicaRule | None = None,
    precision: str = "fp32",
) -> dict:
    """The parts of a :class:`Pipeline` of ``model`` in ``world``: ``Pipeline(**assemble(...))``.

    ``num_batches`` and ``batches_per_epoch`` count each replica's minibatches. Every rank calls
    it alike, with an identical ``model`` (same seed; ranks check they agree); each replica this
    process holds gets its own copy of it. Rank 0 decides the placement of stages on the pipeline
    positions (``"even"``, ranges like ``"0-3,4-9"``, or ``"balanced"``: costs from
    ``measure(model, sample or get_batch(0), method=, device=)``, e.g.
    :func:`petra_core.accounting.measure_stage_costs`). This process's stages move to their
    devices (``world.placement.device_for``); ``get_batch`` is called only where stage 0 lives.
    """
    from .placement import parse_placement

    method, rule = get_method(method), get_rule(rule)
    J, R = len(model), world.placement.mesh.replicas
    rule.check_mesh(stages=J, replicas=R)  # what the rule declares it needs: one line now, not at the first step
    schedule = schedule_for(method, J, num_batches, check_k(k))
    rule.check(schedule=method.schedule, k=k)
    if world.placement.world_size > 1:
        from .distributed.world import model_fingerprint

        config = (
            getattr(model, "arch", None),
            J,
            method.name,
            rule.name,
            str(world.placement.mesh),
            num_batches,
            k,
            batch_size,
            model_fingerprint(model),
        )
        configs = world.ranks.all_objects(config)
        differ = [r for r, c in enumerate(configs) if c != configs[0]]
        if differ:
            raise ValueError(
                f"ranks disagree on (arch, stages, method, rule, mesh, minibatches, k, batch, weights): "
                f"rank 0 has {configs[0][:-1]}, ranks {differ} differ (same seed on every rank?): "
                + "; ".join(f"rank {r}: {configs[r][:-1]}" for r in differ)
            )
    decision = None
    if world.placement.is_main:
        try:
            costs = None
            if placement == "balanced":
                if measure is None or (get_batch is None and sample is None):
                    raise ValueError(
                        "placement 'balanced' needs measured stage costs: pass measure= (e.g. "
                        "petra_core.accounting.measure_stage_costs) and a sample minibatch"
                    )
                costs = measure(
                    model,
                    sample if sample is not None else get_batch(0),
                    method=method,
                    device=world.placement.device_for(0) or next(model.parameters()).device,
                )
            decision = (parse_placement(placement, J, world.placement.mesh.positions, costs), costs)
        except ValueError as err:  # a bad spec: every rank raises it, none waits for the others
            decision = str(err)
    decision = world.ranks.share(decision)
    if isinstance(decision, str):
        raise ValueError(decision)
    ranges, stage_costs = decision
    world.connect(ranges, schedule, backward=method.gradients_cross)
    models = {r: model if i == 0 else copy.deepcopy(model) for i, r in enumerate(world.placement.replicas)}
    if rule.init == "different":  # a population of distinct initialisations
        from ..replicas.population import reinitialise

        for r, m in models.items():
            if r > 0:
                reinitialise(m, rule.seed, r)
    for m in models.values():
        for j in world.placement.stages:
            if world.placement.device_for(j) is not None:
                m[j].to(world.placement.device_for(j))
    first = next(model[world.placement.stages.start].parameters()).device
    if get_batch is not None and first.type != "cpu":
        user_get_batch = get_batch

        def get_batch(mb: int):  # images to stage 0's device; labels stay on the (pinned) host until the
            images, labels = user_get_batch(mb)  # head copies them to its own device (copies.py)
            return images.to(first, non_blocking=True), labels

    replicas = [
        Replica(
            r,
            m,
            build_workers(
                m,
                method,
                k=k,
                recipe=recipe,
                batch_size=batch_size * R,
                batches_per_epoch=batches_per_epoch or max(num_batches, 1),
                stages=world.placement.stages,
                replica=r,
                precision=precision,
            ),
        )
        for r, m in models.items()
    ]
    return dict(
        replicas=replicas,
        schedule=schedule,
        world=world,
        get_batch=get_batch,
        method=method,
        rule=rule,
        stage_costs=stage_costs,
        sync_timing=sync_timing,
    )
