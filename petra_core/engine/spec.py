"""What a pipeline is made of, in one place: :class:`PipelineSpec`.

A spec names everything :meth:`Pipeline.build <petra_core.engine.pipeline.Pipeline.build>` needs:
the model and its method, the schedule's settings, the replicas' rule and the world they live in,
the data, the optimisation recipe and precision, the placement of stages on pipeline positions and
what watches the run. It is checked when it is made, one line per bad value, so a bad value is
refused before any rank waits for another or any stage moves. Every rank of a distributed run
makes the same spec (its own ``world``; ``get_batch`` only where stage 0 lives).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from torch import Tensor

from ..methods import Method, check_method_fits, get_method
from ..methods.schedule import Schedule
from ..models import StagedModel
from ..optim import Recipe
from ..precision import check_precision
from ..replicas import ReplicaRule, get_rule
from .observers import Observer
from .phases import PHASES, check_phases  # noqa: F401  (PHASES: the spec's allowed values, read by benchmarks)
from .placement import PlacementSpec
from .stage_streams import check_stage_streams
from .worlds import World

GetBatch = Callable[[int], tuple[Tensor, Tensor]]  # minibatch id of the run's stream -> (images, labels)
Measure = Callable[..., list[float]]  # (model, sample, *, method, device) -> seconds per stage


def check_k(k: object) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"accumulation k must be an integer >= 1, got {k!r}")
    return k


def schedule_for(method: Method, num_stages: int, num_batches: int, k: int = 1) -> Schedule:
    """The schedule ``method`` runs its stages on (the one place that reads it from the method)."""
    return method.schedule(num_stages, num_batches, k=k)


def _count(name: str, value: object, least: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class PipelineSpec:
    """One pipeline, as every rank describes it. ``method`` and ``rule`` may be given by name (None:
    ``dp``); they are kept resolved. The number of replicas is the world's (``world.mesh.replicas``);
    ``num_batches`` and ``batches_per_epoch`` count each replica's minibatches, ``batch_size`` is one
    replica's minibatch. ``offset``: replica r runs its schedule ``offset * r`` ticks after replica 0
    (cyclic execution, one process only). ``placement``: ``"even"``, ranges like ``"0-3,4-9"`` or
    ``"balanced"``, which rank 0 decides from ``measure(model, sample or get_batch(0), method=,
    device=)`` (e.g. :func:`petra_core.engine.stage_costs.measure_stage_costs`)."""

    # what is trained, and how
    model: StagedModel
    method: Method | str
    recipe: Recipe = Recipe()
    precision: str = "fp32"
    # the schedule
    num_batches: int
    k: int = 1
    offset: int = 0
    # the replicas and the world they live in
    rule: ReplicaRule | str | None = None
    world: World
    # the data
    get_batch: GetBatch | None = None
    batch_size: int
    batches_per_epoch: float | None = None
    sample: tuple[Tensor, Tensor] | None = None
    # where the stages go
    placement: PlacementSpec = "even"
    measure: Measure | None = None
    # how each stage's phases execute (engine/phases.py): eager, static (fixed buffers) or graphs (CUDA)
    phases: str = "eager"
    # a CUDA stream per stage in one process, joined at tick ends (engine/stage_streams.py)
    stage_streams: bool = False
    # what watches the run
    observers: Sequence[Observer] = field(default_factory=tuple)
    sync_timing: bool = False

    def __post_init__(self):
        object.__setattr__(self, "method", get_method(self.method))
        object.__setattr__(self, "rule", get_rule(self.rule))
        object.__setattr__(self, "observers", tuple(self.observers))
        check_method_fits(self.method, self.model)
        check_k(self.k)
        _count("num_batches", self.num_batches, 0)
        _count("batch_size", self.batch_size, 1)
        _count("offset (ticks between replicas' starts)", self.offset, 0)
        check_precision(self.precision)
        check_phases(self.phases, self.method, replicas=self.replicas)
        check_stage_streams(self.stage_streams, replicas=self.replicas)
        if self.batches_per_epoch is not None and not self.batches_per_epoch > 0:
            raise ValueError(f"batches_per_epoch must be > 0 (or None: num_batches), got {self.batches_per_epoch!r}")
        if self.offset and self.world.placement.world_size > 1:
            raise ValueError("a cyclic offset between replicas runs in the simulator (one process), not on ranks")
        if self.world.placement.position == 0 and self.get_batch is None:
            raise ValueError(f"{self.world.placement.describe()} owns stage 0 of its replica and needs get_batch")
        if self.placement == "balanced" and self.measure is None:
            raise ValueError(
                "placement 'balanced' needs measured stage costs: pass measure= "
                "(petra_core.engine.stage_costs.measure_stage_costs)"
            )
        # what the rule declares it needs: one line now, not at the first step
        self.rule.check_mesh(stages=len(self.model), replicas=self.replicas)
        self.rule.check(schedule=self.method.schedule, k=self.k)

    @cached_property
    def schedule(self) -> Schedule:
        """Made once: the runner, the transport and every worker's build read this one table (a
        flushed schedule caches its groups' tables on itself)."""
        return schedule_for(self.method, len(self.model), self.num_batches, self.k)

    @property
    def replicas(self) -> int:
        return self.world.placement.mesh.replicas

    @property
    def distinct_inits(self) -> bool:
        """Does the rule want each replica initialised on its own (a population)?"""
        return self.rule.init == "different"
