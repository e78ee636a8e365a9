"""The session of one training run in this process: its world, data, model and pipeline.

A run lives in one process (``runtime: simulator``) or in one process per rank (``runtime:
distributed``, every rank runs ``petra train`` under torchrun). One :class:`Session` serves both:
it builds the run's world (a :class:`~petra_core.engine.world.LocalWorld` holding every replica,
or a ``DistributedWorld``: this rank's cell of the replicas × pipeline mesh, joined from
torchrun's environment), the data (read where a replica's stage 0 lives, and on rank 0, which
evaluates), the model (every rank builds the same from the seed) and the
:class:`~petra_core.engine.pipeline.Pipeline`; it gives the trainer (``trainer.py``) the world's
collectives, the model to evaluate and the checkpoint (``checkpoints.py``).

With R replicas each epoch's B minibatches are shared out in turn: replica r trains on the
epoch's minibatches r, r + R, ... (B // R of them; the last B mod R are left out).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch

from ..data import DataError, Prefetcher, build_data
from ..engine import LocalWorld, Pipeline, PipelineSpec
from ..engine.placement import format_placement
from ..engine.stage_costs import measure_stage_costs
from ..models import build_model
from ..optim import Recipe
from ..replicas import get_rule
from .checkpoints import Checkpoints
from .config import ConfigError, RunConfig

USER_ERRORS = (ConfigError, DataError, ValueError)  # raised by every rank together, one line each


def load_data(cfg: RunConfig):
    common = dict(batch_size=cfg.batch_size, seed=cfg.seed, subset=cfg.subset, eval_batch_size=cfg.eval_batch_size)
    if cfg.dataset == "synthetic":
        return build_data(
            "synthetic",
            n_train=cfg.synthetic_train,
            n_test=cfg.synthetic_test,
            num_classes=cfg.synthetic_classes,
            **common,
        )
    return build_data(cfg.dataset, source=cfg.data_source, prepared_dir=cfg.prepared_path(), **common)


def make_model(cfg: RunConfig, num_classes: int, stem: str):
    """The run's model, initialised from its seed (every rank of a distributed run builds the same)."""
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.arch, num_classes=num_classes, stem=stem, width=cfg.width, aux_head=cfg.aux_head)
    if cfg.channels_last:
        model.to(memory_format=torch.channels_last)
    return model


def local_devices(device: torch.device) -> list[torch.device] | None:
    """A one-process run on ``cuda`` spreads its stages over every visible GPU, in contiguous blocks."""
    if device.type != "cuda":
        return None
    return [torch.device("cuda", i) for i in range(torch.cuda.device_count())] if device.index is None else [device]


def recipe_of(cfg: RunConfig) -> Recipe:
    return Recipe(
        base_lr=cfg.base_lr,
        momentum=cfg.momentum,
        nesterov=True,
        weight_decay=cfg.weight_decay,
        warmup_epochs=cfg.warmup_epochs,
        milestones=tuple(cfg.milestones),
        gamma=cfg.gamma,
        scale_lr=cfg.scale_lr,
        optimizer=cfg.optimizer,
    )


def finite(module) -> bool:
    return all(
        bool(torch.isfinite(t).all()) for t in (*module.parameters(), *module.buffers()) if t.is_floating_point()
    )


def torchrun_command(args: list[str], nprocs: int = 2) -> str:
    import shlex

    return shlex.join(["torchrun", f"--nproc-per-node={nprocs}", "-m", "petra_core.cli", "train", *args])


class Session:
    """The world, data, model and pipeline of one run, and its checkpoints."""

    def __init__(
        self, cfg: RunConfig, run_dir: Path, device: torch.device, *, checkpoint_dir: Path | None = None, on_start=None
    ):
        self.cfg, self.run_dir = cfg, run_dir
        checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else run_dir
        self.pipe, self.data, self.manifest, self.prefetcher = None, None, None, None
        if cfg.runtime == "distributed":
            from ..engine.distributed import DistributedWorld
            from ..engine.launch import init_distributed

            if "WORLD_SIZE" not in os.environ:
                raise ConfigError(
                    "runtime=distributed runs one process per rank: launch it with torchrun, "
                    "e.g. " + torchrun_command(["CONFIG...", "runtime=distributed"])
                )
            device = init_distributed(timeout=cfg.dist_timeout, device=device)
            try:
                self.world = DistributedWorld(device, timeout=cfg.dist_timeout, replicas=cfg.replicas)
            except ValueError as err:  # replicas that do not divide the ranks: the world says so, in one line
                raise ConfigError(str(err)) from None
        else:
            if int(os.environ.get("WORLD_SIZE", "1")) > 1:
                raise ConfigError(
                    f"runtime=simulator in a launch of {os.environ['WORLD_SIZE']} processes "
                    f"(WORLD_SIZE); add runtime=distributed, or run it as one process"
                )
            self.world = LocalWorld(devices=local_devices(device), replicas=cfg.replicas)
        self.is_main = self.world.is_main
        self.checkpoints = Checkpoints(checkpoint_dir, cfg, self.world)
        self.checkpoint_path = self.checkpoints.path
        try:
            if on_start is not None:
                on_start()
            self._setup()
        except USER_ERRORS:
            self.close()
            raise
        except BaseException as err:
            self.failed(err)
            self.close(ok=False)
            raise

    def _setup(self) -> None:
        cfg, world = self.cfg, self.world
        self.manifest = self.together(self.checkpoints.read_manifest)  # it fixes the ranks and the placement
        placement = self.manifest["placement"] if self.manifest else cfg.placement
        reads_data = self.is_main or world.position == 0  # evaluation; a replica's stage 0

        def read_data():
            if not reads_data:
                return None
            self.data = load_data(cfg)
            return self.data.train.num_batches, self.data.num_classes, self.data.stem

        B, num_classes, stem = world.share(self.together(read_data))
        R = cfg.replicas
        if B < R:
            raise ConfigError(
                f"replicas={R} needs at least {R} minibatches per epoch, the training set gives {B} "
                f"(batch_size={cfg.batch_size})"
            )
        self.batches_per_epoch = B // R  # each replica's
        self.stream_batches_per_epoch = G = B // R * R  # all replicas' together: the stream's epoch
        self.model = make_model(cfg, num_classes, stem)

        def get_batch(mb: int):  # minibatch mb of the stream (replica mb % R's)
            return self.data.train.batch(mb // G, mb % G)

        ahead = cfg.prefetch if cfg.prefetch is not None else (4 if cfg.device == "cuda" else 0)
        if ahead and world.position == 0:
            get_batch = self.prefetcher = Prefetcher(
                get_batch,
                ahead=ahead,
                pin=cfg.device == "cuda",
                limit=cfg.epochs * G,
                stride=1 if world.world_size == 1 else R,
            )

        self.pipe: Pipeline = self.together(
            lambda: Pipeline.build(
                PipelineSpec(
                    model=self.model,
                    method=cfg.method,
                    recipe=recipe_of(cfg),
                    precision=cfg.precision,
                    num_batches=cfg.epochs * self.batches_per_epoch,
                    k=cfg.k,
                    rule=get_rule(cfg.replica_rule, stages=cfg.rule_stages, options=cfg.rule_options, seed=cfg.seed),
                    world=world,
                    get_batch=get_batch if world.position == 0 else None,
                    batch_size=cfg.batch_size,
                    batches_per_epoch=self.batches_per_epoch,
                    placement=placement,
                    measure=measure_stage_costs,
                )
            )
        )

    # ---- keeping ranks in step (trivial in one process) ------------------------------------------
    def together(self, fn):
        return self.world.together(fn, USER_ERRORS)

    def on_main(self, fn):
        return self.world.on_main(fn, USER_ERRORS)

    def share(self, obj):
        return self.world.share(obj)

    def agree(self, signal: str | None, diverged: str | None) -> tuple[str | None, str | None]:
        return self.world.agree(signal, diverged, self.pipe.tick - 1)

    def all_finite(self) -> bool:
        """Are the weights and batch-norm statistics of every stage finite? (collective)"""
        self.pipe.complete_steps()
        return self.world.all_true(all(finite(rep.model[j]) for rep in self.pipe.replicas for j in self.pipe.stages))

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
        if self.world.world_size == 1:
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
        mine = (0 in self.world.replicas, self.pipe.floats_sent())
        parts = self.world.all_objects(mine)
        return sum(f for holds_0, f in parts if holds_0)

    def environment(self) -> dict:
        env = {
            "runtime": self.cfg.runtime,
            "world_size": self.world.world_size,
            "mesh": str(self.world.mesh),
            "placement": format_placement(self.world.placement),
        }
        if hasattr(self.world, "backend"):
            env["backend"] = self.world.backend
        return env

    # ---- checkpoints ---------------------------------------------------------------------------------
    def has_checkpoint(self) -> bool:
        return self.manifest is not None

    def load_checkpoint(self) -> list[dict]:
        manifest, self.manifest = self.manifest, None
        return self.checkpoints.restore(self.pipe, manifest)

    def save_checkpoint(self, history: list[dict]) -> None:
        model = self._full_state()  # collective: before any rank writes its part
        self.checkpoints.save(self.pipe, history, model)

    # ---- failures and shutdown ----------------------------------------------------------------------
    def failed(self, err: BaseException) -> None:
        """Make the other ranks stop (they may be waiting for this one)."""
        from ..engine.distributed.failures import PipelineError, short

        if self.world.world_size > 1 and not isinstance(err, PipelineError):
            self.world.report(f"petra: rank {self.world.rank} failed: {type(err).__name__}: {short(err)}")

    def close(self, ok: bool = True) -> None:
        """Stop the pipeline's threads and leave the process group (see DistributedWorld.leave)."""
        if self.pipe is not None:
            self.pipe.close()
        if self.prefetcher is not None:
            self.prefetcher.close()
        self.world.leave(ok)
