"""Where a training run's pipeline lives: one process (``runtime: simulator``) or one process per
rank (``runtime: distributed``, every rank runs ``petra train`` under torchrun).

One :class:`Runtime` serves both: it builds the run's world (a
:class:`~petra_core.engine.world.LocalWorld`, or a ``DistributedWorld`` joined from torchrun's
environment), the data (read on rank 0, which owns stage 0), the model (every rank builds the
same from the seed) and the :class:`~petra_core.engine.pipeline.Pipeline`; it gives the trainer
(``train.py``) the world's collectives, the model to evaluate and the checkpoint files.

A checkpoint is ``checkpoint.pt`` (in the run directory, or in a separate checkpoint directory:
profile runs keep theirs under ``checkpoints/``, where DVC versions them): the whole model, the history, the config and the placement,
plus the in-flight pipeline (queued activations and gradients, buffers, stashes, optimizer and
scheduler state). In a distributed run every rank first writes its own in-flight state and
stages to ``checkpoint-parts/rank{r}-tick{t}.pt``; rank 0's ``checkpoint.pt`` (naming the parts)
then commits the checkpoint, and older parts are deleted after that.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from . import runio
from .config import ConfigError, RunConfig, check_same_run
from .accounting import measure_stage_costs
from .data import DataError, Prefetcher, build_data
from .engine import LocalWorld, Pipeline, assemble
from .placement import format_placement
from .models import build_model
from .optim import Recipe

PARTS = "checkpoint-parts"
USER_ERRORS = (ConfigError, DataError, ValueError)  # raised by every rank together, one line each


def load_data(cfg: RunConfig):
    common = dict(batch_size=cfg.batch_size, seed=cfg.seed, subset=cfg.subset, eval_batch_size=cfg.eval_batch_size)
    if cfg.dataset == "synthetic":
        return build_data("synthetic", n_train=cfg.synthetic_train, n_test=cfg.synthetic_test,
                          num_classes=cfg.synthetic_classes, **common)
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
    return Recipe(base_lr=cfg.base_lr, momentum=cfg.momentum, nesterov=True, weight_decay=cfg.weight_decay,
                  warmup_epochs=cfg.warmup_epochs, milestones=tuple(cfg.milestones), gamma=cfg.gamma,
                  scale_lr=cfg.scale_lr)


def finite(module) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in (*module.parameters(), *module.buffers())
               if t.is_floating_point())


def torchrun_command(args: list[str], nprocs: int = 2) -> str:
    import shlex

    return shlex.join(["torchrun", f"--nproc-per-node={nprocs}", "-m", "petra_core.cli", "train", *args])


class Runtime:
    """The world, data, model and pipeline of one run, and its checkpoints."""

    def __init__(self, cfg: RunConfig, run_dir: Path, device: torch.device, *, checkpoint_dir: Path | None = None,
                 on_start=None):
        self.cfg, self.run_dir = cfg, run_dir
        checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else run_dir
        self.checkpoint_path, self.parts_dir = checkpoint_dir / runio.CHECKPOINT, checkpoint_dir / PARTS
        self.pipe, self.data, self.manifest, self.prefetcher = None, None, None, None
        if cfg.runtime == "distributed":
            from .engine.distributed import DistributedWorld
            from .launch import init_distributed

            if "WORLD_SIZE" not in os.environ:
                raise ConfigError("runtime=distributed runs one process per rank: launch it with torchrun, "
                                  "e.g. " + torchrun_command(["CONFIG...", "runtime=distributed"]))
            self.world = DistributedWorld(init_distributed(timeout=cfg.dist_timeout, device=device),
                                          timeout=cfg.dist_timeout)
        else:
            if int(os.environ.get("WORLD_SIZE", "1")) > 1:
                raise ConfigError(f"runtime=simulator in a launch of {os.environ['WORLD_SIZE']} processes "
                                  f"(WORLD_SIZE); add runtime=distributed, or run it as one process")
            self.world = LocalWorld(devices=local_devices(device))
        self.is_main = self.world.is_main
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
        self.manifest = self.together(self._read_manifest)  # a checkpoint fixes the ranks and the placement
        placement = self.manifest["placement"] if self.manifest else cfg.placement

        def read_data():
            if not self.is_main:
                return None
            self.data = load_data(cfg)
            return self.data.train.num_batches, self.data.num_classes, self.data.stem

        B, num_classes, stem = world.share(self.together(read_data))
        self.batches_per_epoch = B
        self.model = make_model(cfg, num_classes, stem)

        def get_batch(mb: int):
            return self.data.train.batch(mb // B, mb % B)

        ahead = cfg.prefetch if cfg.prefetch is not None else (4 if cfg.device == "cuda" else 0)
        if ahead and self.is_main:
            get_batch = self.prefetcher = Prefetcher(get_batch, ahead=ahead, pin=cfg.device == "cuda",
                                                     limit=cfg.epochs * B)

        self.pipe: Pipeline = self.together(lambda: Pipeline(**assemble(
            self.model, cfg.method, world, num_batches=cfg.epochs * B, get_batch=get_batch if self.is_main else None,
            batch_size=cfg.batch_size, k=cfg.k, recipe=recipe_of(cfg), batches_per_epoch=B, placement=placement,
            measure=measure_stage_costs)))

    def _read_manifest(self) -> dict | None:
        if not self.checkpoint_path.exists():
            return None
        manifest = runio.load_checkpoint(self.checkpoint_path)
        written = manifest.get("runtime", "simulator")
        if written != self.cfg.runtime:
            raise ConfigError(f"{self.checkpoint_path} was written by runtime={written}; resume it with that runtime")
        check_same_run(self.checkpoint_path, manifest.get("config"), self.cfg)
        ranks = manifest.get("world_size", 1)
        if ranks != self.world.world_size:
            raise ConfigError(f"{self.checkpoint_path} was written by {ranks} ranks, this launch has "
                              f"{self.world.world_size}; resume with torchrun --nproc-per-node={ranks}")
        return manifest

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
        return self.world.all_true(all(finite(self.model[j]) for j in self.pipe.stages))

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
                stage.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
                stage.to(next(self.model[0].parameters()).device)
        return self.model

    def environment(self) -> dict:
        env = {"runtime": self.cfg.runtime, "world_size": self.world.world_size,
               "placement": format_placement(self.world.placement)}
        if hasattr(self.world, "backend"):
            env["backend"] = self.world.backend
        return env

    # ---- checkpoints ---------------------------------------------------------------------------------
    def has_checkpoint(self) -> bool:
        return self.manifest is not None

    def load_checkpoint(self) -> list[dict]:
        manifest, self.manifest = self.manifest, None

        def load():
            if manifest.get("parts") is None:  # one process: everything in checkpoint.pt
                self.model.load_state_dict(manifest["model"])
                self.pipe.load_state_dict(manifest["pipeline"])
                return
            path = self.parts_dir / manifest["parts"][self.world.rank]
            if not path.exists():
                raise ConfigError(f"{path} is missing: the checkpoint of {self.checkpoint_path} is incomplete")
            part = runio.load_checkpoint(path)
            if part["pipeline"]["tick"] != manifest["tick"]:
                raise ConfigError(f"{path} is of tick {part['pipeline']['tick']}, {self.checkpoint_path} of tick "
                                  f"{manifest['tick']}")
            for j, sd in part["stages"].items():
                self.model[j].load_state_dict(sd)
            self.pipe.load_state_dict(part["pipeline"])

        self.together(load)
        return manifest["history"]

    def save_checkpoint(self, history: list[dict]) -> None:
        tick, ranks = self.pipe.tick, self.world.world_size
        pipeline = self.pipe.state_dict()  # settles the transport: nothing left on the wire
        model = self._full_state()
        names = None
        if ranks > 1:
            names = [f"rank{r}-tick{tick}.pt" for r in range(ranks)]
            self.together(lambda: runio.save_checkpoint(self.parts_dir / names[self.world.rank], {
                "stages": self.pipe.stage_state_dicts(), "pipeline": pipeline}))

        def commit():  # rank 0, once every part is on disk
            runio.save_checkpoint(self.checkpoint_path, {
                "runtime": self.cfg.runtime, "world_size": ranks, "placement": format_placement(self.world.placement),
                "tick": tick, "parts": names, "pipeline": pipeline if names is None else None,
                "model": model, "history": history, "config": self.cfg.to_dict()})
            if names is not None:
                for stale in self.parts_dir.iterdir():
                    if stale.name not in names:
                        stale.unlink(missing_ok=True)

        self.on_main(commit)

    # ---- failures and shutdown ----------------------------------------------------------------------
    def failed(self, err: BaseException) -> None:
        """Make the other ranks stop (they may be waiting for this one)."""
        from .engine.distributed.failures import PipelineError, short

        if self.world.world_size > 1 and not isinstance(err, PipelineError):
            self.world.report(f"petra: rank {self.world.rank} failed: {type(err).__name__}: {short(err)}")

    def close(self, ok: bool = True) -> None:
        """Stop the pipeline's threads and leave the process group (see DistributedWorld.leave)."""
        if self.pipe is not None:
            self.pipe.close()
        if self.prefetcher is not None:
            self.prefetcher.close()
        if hasattr(self.world, "leave"):
            self.world.leave(ok)
