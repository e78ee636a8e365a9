"""The session of one training run in this process: its world, data, model and pipeline.

A run lives in one process (``runtime: simulator``) or in one process per rank (``runtime:
distributed``, every rank runs ``petra train`` under torchrun). One :class:`Session` serves both:
it builds the run's world (a :class:`~petra_core.engine.worlds.LocalWorld` holding every replica,
or a ``DistributedWorld``: this rank's cell of the replicas × pipeline mesh, joined from
torchrun's environment), the data (read where a replica's stage 0 lives, and on rank 0, which
evaluates), the model (every rank builds the same from the seed) and the
:class:`~petra_core.engine.pipeline.Pipeline` (``Pipeline.build`` of a ``PipelineSpec``), from a
:class:`SessionPlan` the trainer read from the config: the session never sees the config. It
gives the trainer (``trainer.py``) the world's collectives, the model to evaluate and the
checkpoint (``checkpoints.py``, whose manifest the trainer read before any process group existed).

With R replicas each epoch's B minibatches are shared out in turn: replica r trains on the
epoch's minibatches r, r + R, ... (B // R of them; the last B mod R are left out).
"""

from __future__ import annotations

import copy
import functools
import os
import sys
from dataclasses import dataclass

import torch

from ..data import DataError, Prefetcher, build_data
from ..engine import LocalWorld, Pipeline, PipelineSpec
from ..engine.placement import format_placement
from ..engine.stage_costs import measure_stage_costs
from ..families import build
from ..methods import Method
from ..optim import Recipe
from ..precision import set_numerics
from ..replicas import ReplicaRule
from .checkpoints import Checkpoints
from .config import ConfigError

USER_ERRORS = (ConfigError, DataError, ValueError)  # raised by every rank together, one line each


@dataclass(frozen=True)
class SessionPlan:
    """What one run's session is made of, read from its config once, by the trainer
    (``trainer.session_plan``): the session never sees the config, and never calls back up."""

    runtime: str  # simulator (one process) or distributed (one process per rank, under torchrun)
    device: torch.device
    threads: int | None
    precision: str
    phases: str  # engine/phases.py: eager, static or graphs
    stage_streams: bool  # engine/stage_streams.py: a CUDA stream per stage
    deterministic: bool
    dist_timeout: float
    replicas: int
    data: dict  # build_data's arguments
    model: dict  # build_model's arguments, but the classes and stem the data decides
    seed: int
    channels_last: bool
    epochs: int
    prefetch: int  # minibatches read ahead on stage 0's rank (0: none)
    method: Method  # bounded rebuild chains included (rebuild_span)
    k: int
    batch_size: int
    recipe: Recipe
    rule: ReplicaRule
    placement: str  # the config's; a checkpoint's placement wins


def local_devices(device: torch.device) -> list[torch.device] | None:
    """A one-process run on ``cuda`` spreads its stages over every visible GPU, in contiguous blocks."""
    if device.type != "cuda":
        return None
    return [torch.device("cuda", i) for i in range(torch.cuda.device_count())] if device.index is None else [device]


def finite(module) -> bool:
    return all(
        bool(torch.isfinite(t).all()) for t in (*module.parameters(), *module.buffers()) if t.is_floating_point()
    )


def torchrun_command(args: list[str], nprocs: int = 2) -> str:
    import shlex

    return shlex.join(["torchrun", f"--nproc-per-node={nprocs}", "-m", "petra_core.cli", "train", *args])


class Session:
    """The world, data, model and pipeline of one run, and its checkpoints, made top-down from
    ``plan``: numerics, world, data, model, pipeline. ``manifest``: the checkpoint to resume from
    (read and checked by the trainer before any process group exists), None to start afresh."""

    def __init__(self, plan: SessionPlan, checkpoints: Checkpoints, manifest: dict | None, *, on_start=None):
        self.plan, self.checkpoints, self.manifest = plan, checkpoints, manifest
        self.checkpoint_path = checkpoints.path
        self.world, self.pipe, self.data, self.prefetcher = None, None, None, None
        try:
            self._build(plan, on_start)
        except USER_ERRORS:
            self.close()
            raise
        except BaseException as err:
            self.failed(err)
            self.close(ok=False)
            raise

    @staticmethod
    def _join(plan: SessionPlan):
        """This process's numerics and world: every replica here, or this rank's cell of the mesh
        (joined from torchrun's environment)."""
        distributed, size = plan.runtime == "distributed", os.environ.get("WORLD_SIZE")
        if distributed and size is None:
            raise ConfigError(
                "runtime=distributed runs one process per rank: launch it with torchrun, "
                "e.g. " + torchrun_command(["CONFIG...", "runtime=distributed"])
            )
        if not distributed and int(size or 1) > 1:
            raise ConfigError(
                f"runtime=simulator in a launch of {size} processes (WORLD_SIZE); add runtime=distributed, "
                f"or run it as one process"
            )
        devices = None if distributed else local_devices(plan.device)
        if plan.threads:
            torch.set_num_threads(plan.threads)
        set_numerics(plan.precision, plan.deterministic)  # TF32 flags, deterministic algorithms, cuDNN benchmark
        if not distributed:
            return LocalWorld(devices=devices, replicas=plan.replicas)
        from ..engine.distributed import DistributedWorld
        from ..engine.launch import init_distributed

        device = init_distributed(timeout=plan.dist_timeout, device=plan.device)
        try:
            return DistributedWorld(device, timeout=plan.dist_timeout, replicas=plan.replicas)
        except ValueError as err:  # replicas that do not divide the ranks: the world says so, in one line
            raise ConfigError(str(err)) from None

    def _build(self, plan: SessionPlan, on_start) -> None:
        """The world, then the data (read where a replica's stage 0 lives, and on rank 0, which
        evaluates), the model (every rank the same, from the seed) and the pipeline of them: one
        pass down, nothing below calls back into the session."""
        self.world = world = self._join(plan)
        self.is_main, R = world.placement.is_main, plan.replicas
        if self.is_main and self.checkpoints.warning:
            print(f"petra: warning: {self.checkpoints.warning}", file=sys.stderr)
        if on_start is not None:
            on_start()
        self.checkpoints.check_launch(self.manifest, world.placement.world_size)  # it fixes the ranks and the placement
        reads_data = self.is_main or world.placement.position == 0
        self.data = self.together(functools.partial(build_data, **plan.data) if reads_data else lambda: None)
        B, num_classes, stem = world.ranks.share(
            (self.data.train.num_batches, self.data.num_classes, self.data.stem) if reads_data else None
        )
        if B < R:
            raise ConfigError(
                f"replicas={R} needs at least {R} minibatches per epoch, the training set gives {B} "
                f"(batch_size={plan.batch_size})"
            )
        self.batches_per_epoch = B // R  # each replica's
        self.stream_batches_per_epoch = G = B // R * R  # all replicas' together: the stream's epoch
        torch.manual_seed(plan.seed)  # every rank builds the same model
        self.model = build(**plan.model, num_classes=num_classes, stem=stem)
        if plan.channels_last:
            self.model.to(memory_format=torch.channels_last)

        def get_batch(mb: int):  # minibatch mb of the stream (replica mb % R's)
            return self.data.train.batch(mb // G, mb % G)

        if plan.prefetch and world.placement.position == 0:
            get_batch = self.prefetcher = Prefetcher(
                get_batch,
                ahead=plan.prefetch,
                pin=plan.device.type == "cuda",
                limit=plan.epochs * G,
                stride=1 if world.placement.world_size == 1 else R,
            )
        spec = PipelineSpec(
            model=self.model,
            method=plan.method,
            recipe=plan.recipe,
            precision=plan.precision,
            phases=plan.phases,
            stage_streams=plan.stage_streams,
            num_batches=plan.epochs * self.batches_per_epoch,
            k=plan.k,
            rule=plan.rule,
            world=world,
            get_batch=get_batch if world.placement.position == 0 else None,
            batch_size=plan.batch_size,
            batches_per_epoch=self.batches_per_epoch,
            placement=self.manifest["placement"] if self.manifest else plan.placement,
            measure=measure_stage_costs,
        )
        self.pipe: Pipeline = self.together(functools.partial(Pipeline.build, spec))

    # ---- keeping ranks in step (trivial in one process) ------------------------------------------
    def together(self, fn):
        return self.world.ranks.together(fn, USER_ERRORS)

    def on_main(self, fn):
        return self.world.ranks.on_main(fn, USER_ERRORS)

    def share(self, obj):
        return self.world.ranks.share(obj)

    def agree(self, signal: str | None, diverged: str | None) -> tuple[str | None, str | None]:
        return self.world.ranks.agree(signal, diverged, self.pipe.tick - 1)

    def all_finite(self) -> bool:
        """Are the weights and batch-norm statistics of every stage finite? (collective)"""
        self.pipe.complete_steps()
        return self.world.ranks.all_true(
            all(finite(rep.model[j]) for rep in self.pipe.replicas for j in self.pipe.stages)
        )

    def _full_state(self) -> dict | None:
        """The whole model's state on rank 0 (gathered once per tick)."""
        if getattr(self, "_gathered", (None,))[0] != self.pipe.tick:
            self._gathered = (self.pipe.tick, self.pipe.gather_state_dict())
        return self._gathered[1]

    def model_for_eval(self):
        """Rank 0: its model with every other rank's stages loaded (collective); None elsewhere."""
        state = self._full_state()
        if not self.is_main:
            return None
        for j, stage in enumerate(self.model):
            if j not in self.pipe.stages:  # never touch the stages in training (autograd versions)
                prefix = f"{j}."
                stage.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})
                stage.to(next(self.model[0].parameters()).device)
        return self.model

    def population_for_eval(self) -> list | None:
        """Rank 0: one whole model per replica, in replica order (collective); None elsewhere. In
        one process the live models; across ranks copies of rank 0's model with each replica's
        gathered state."""
        states = self.pipe.gather_replica_states()
        if not self.is_main:
            return None
        if self.world.placement.world_size == 1:
            return [rep.model for rep in self.pipe.replicas]
        device = next(self.model[0].parameters()).device
        models = []
        for state in states:
            m = copy.deepcopy(self.model)
            m.load_state_dict(state)
            models.append(m.to(device))
        return models

    def floats_sent_per_replica(self) -> int:
        """Floats one replica (replica 0) has put into collectives since the run began (collective)."""
        mine = (0 in self.world.placement.replicas, self.pipe.floats_sent())
        parts = self.world.ranks.all_objects(mine)
        return sum(f for holds_0, f in parts if holds_0)

    def environment(self) -> dict:
        env = {
            "runtime": self.plan.runtime,
            "world_size": self.world.placement.world_size,
            "mesh": str(self.world.placement.mesh),
            "placement": format_placement(self.world.placement.ranges),
        }
        if hasattr(self.world, "backend"):
            env["backend"] = self.world.backend
        return env

    # ---- checkpoints ---------------------------------------------------------------------------------
    def has_checkpoint(self) -> bool:
        return self.manifest is not None

    def load_checkpoint(self) -> tuple[list[dict], dict | None]:
        """Restore the checkpoint into the pipeline; its history and its observers' state (None: it
        was written without one)."""
        manifest, self.manifest = self.manifest, None
        return self.checkpoints.restore(self.pipe, manifest), manifest.get("observers")

    def save_checkpoint(self, history: list[dict], observers: dict | None = None) -> None:
        """``observers``: what observation-only observers (the fidelity log) need to go on exactly."""
        model = self._full_state()  # collective: before any rank writes its part
        self.checkpoints.save(self.pipe, history, model, observers)

    # ---- failures and shutdown ----------------------------------------------------------------------
    def failed(self, err: BaseException) -> None:
        """Make the other ranks stop (they may be waiting for this one)."""
        from ..engine.distributed.failures import PipelineError, short

        if self.world is not None and self.world.placement.world_size > 1 and not isinstance(err, PipelineError):
            self.world.ranks.report(
                f"petra: rank {self.world.placement.rank} failed: {type(err).__name__}: {short(err)}"
            )

    def close(self, ok: bool = True) -> None:
        """Stop the pipeline's threads and leave the process group (see DistributedWorld.leave)."""
        if self.pipe is not None:
            self.pipe.close()
        if self.prefetcher is not None:
            self.prefetcher.close()
        if self.world is not None:  # None: it failed before it joined a world
            self.world.leave(ok)
