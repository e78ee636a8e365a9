"""Where a training run's pipeline lives: one process (the simulator) or one process per rank.

The trainer (``train.py``) runs one loop for both; a runtime gives it the pipeline (a
:class:`~petra_core.engine.pipeline.Pipeline`), the data, the collective calls that keep ranks
in step (a no-op in one process), and the checkpoint files.

``runtime: distributed`` (every rank runs ``petra train`` under torchrun with the same
arguments): rank 0 reads the data and owns stage 0, the last rank owns the head. Every rank
builds the same model from the same seed and keeps its stages. At every tick boundary the
ranks agree on whether to stop (a signal on any rank, or a non-finite loss at the head). At a
checkpoint every rank writes its part (its stages' weights, workers' state and the messages
sent to it but not yet consumed) to ``checkpoint-parts/rank{r}-tick{t}.pt``; then rank 0
writes ``checkpoint.pt`` (the whole model, the history, the placement and the names of the
parts), which commits the checkpoint; older parts are deleted after that.
"""
from __future__ import annotations

import datetime
import os
from pathlib import Path

import torch
import torch.distributed as dist

from . import runio
from .config import ConfigError, RunConfig, check_same_run
from .data import DataError, build_data
from .engine import Simulator
from .models import build_model
from .optim import Recipe

PARTS = "checkpoint-parts"
CONTROL_TIMEOUT = 3600.0  # how long ranks wait for rank 0 (data preparation, evaluation, checkpoint writes)


def load_data(cfg: RunConfig):
    common = dict(batch_size=cfg.batch_size, seed=cfg.seed, subset=cfg.subset, eval_batch_size=cfg.eval_batch_size)
    if cfg.dataset == "synthetic":
        return build_data("synthetic", n_train=cfg.synthetic_train, n_test=cfg.synthetic_test,
                          num_classes=cfg.synthetic_classes, **common)
    return build_data(cfg.dataset, source=cfg.data_source, prepared_dir=cfg.prepared_path(), **common)


def make_model(cfg: RunConfig, num_classes: int, stem: str):
    """The run's model, initialised from its seed (every rank of a distributed run builds the same)."""
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.arch, num_classes=num_classes, stem=stem, width=cfg.width)
    if cfg.channels_last:
        model.to(memory_format=torch.channels_last)
    return model


def finite(module) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in (*module.parameters(), *module.buffers())
               if t.is_floating_point())


def spread_over_devices(model, device: torch.device) -> None:
    """Contiguous blocks of stages on each visible GPU (all on one device otherwise)."""
    if device.type != "cuda" or torch.cuda.device_count() < 2:
        model.to(device)
        return
    n = torch.cuda.device_count()
    for j, stage in enumerate(model):
        stage.to(torch.device("cuda", j * n // len(model)))


def recipe_of(cfg: RunConfig) -> Recipe:
    return Recipe(base_lr=cfg.base_lr, momentum=cfg.momentum, nesterov=True, weight_decay=cfg.weight_decay,
                  warmup_epochs=cfg.warmup_epochs, milestones=tuple(cfg.milestones), gamma=cfg.gamma,
                  scale_lr=cfg.scale_lr)


class LocalRuntime:
    """``runtime: simulator``: every stage in this process; checkpoint = one file."""

    is_main = True

    def __init__(self, cfg: RunConfig, run_dir: Path, device: torch.device):
        self.cfg, self.checkpoint_path = cfg, run_dir / runio.CHECKPOINT
        self.data = load_data(cfg)
        self.batches_per_epoch = B = self.data.train.num_batches
        self.model = make_model(cfg, self.data.num_classes, self.data.stem)
        spread_over_devices(self.model, device)
        first_device = next(self.model.parameters()).device

        def get_batch(mb: int):
            images, labels = self.data.train.batch(mb // B, mb % B)
            return images.to(first_device), labels

        self.pipe = Simulator(self.model, cfg.method, num_batches=cfg.epochs * B, get_batch=get_batch,
                              batch_size=cfg.batch_size, k=cfg.k, recipe=recipe_of(cfg), batches_per_epoch=B)

    # -- keeping ranks in step (one process: nothing to agree on) -----------------------------------
    def agree(self, signal: str | None, diverged: str | None) -> tuple[str | None, str | None]:
        return signal, diverged

    def on_main(self, fn):
        return fn()

    def share(self, obj):
        return obj

    def model_for_eval(self):
        return self.model

    def all_finite(self) -> bool:
        """Are all weights and batch-norm statistics finite?"""
        return finite(self.model)

    def environment(self) -> dict:
        return {}

    # -- checkpoints -----------------------------------------------------------------------------
    def has_checkpoint(self) -> bool:
        return self.checkpoint_path.exists()

    def load_checkpoint(self) -> list[dict]:
        state = runio.load_checkpoint(self.checkpoint_path)
        if state.get("runtime", "simulator") != "simulator":
            raise ConfigError(f"{self.checkpoint_path} was written by runtime={state['runtime']}; resume it with "
                              f"that runtime")
        check_same_run(self.checkpoint_path, state.get("config"), self.cfg)
        self.model.load_state_dict(state["model"])
        self.pipe.load_state_dict(state["pipeline"])
        return state["history"]

    def save_checkpoint(self, history: list[dict]) -> None:
        runio.save_checkpoint(self.checkpoint_path, {"model": self.model.state_dict(), "pipeline": self.pipe.state_dict(),
                                                     "history": history, "config": self.cfg.to_dict()})

    def failed(self, err: BaseException) -> None:
        """Tell the other ranks (none here)."""

    def close(self, ok: bool = True) -> None:
        self.pipe.close()


def torchrun_command(args: list[str], nprocs: int = 2) -> str:
    import shlex

    return shlex.join(["torchrun", f"--nproc-per-node={nprocs}", "-m", "petra_core.cli", "train", *args])


class DistributedRuntime:
    """``runtime: distributed``: this rank's stages of a pipeline over torch.distributed."""

    def __init__(self, cfg: RunConfig, run_dir: Path, device: torch.device):
        from .engine.distributed import FailureWatch, init_distributed

        if not dist.is_initialized() and "WORLD_SIZE" not in os.environ:
            raise ConfigError("runtime=distributed runs one process per rank: launch it with torchrun, "
                              "e.g. " + torchrun_command(["CONFIG...", "runtime=distributed"]))
        self.cfg, self.run_dir = cfg, run_dir
        self.checkpoint_path, self.parts_dir = run_dir / runio.CHECKPOINT, run_dir / PARTS
        self.device = init_distributed(timeout=cfg.dist_timeout, device=device)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.is_main = self.rank == 0
        self.pipe, self.data, self.manifest = None, None, None
        self.watch = FailureWatch(lambda: f"rank {self.rank}", lambda: 0)  # until the pipeline has its own
        try:
            self._setup(cfg)
        except (ConfigError, DataError, ValueError):  # raised by every rank together
            self.close()
            raise
        except BaseException as err:
            self.failed(err)
            self.close(ok=False)
            raise

    def _setup(self, cfg: RunConfig) -> None:
        from .engine.distributed import DistributedPipeline

        # gloo groups for the trainer's own collectives (CPU objects, even when stages talk NCCL):
        # per tick, bounded like every wait of the pipeline; waits on rank 0, bounded generously
        self.tick_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=cfg.dist_timeout))
        self.control = dist.new_group(backend="gloo",
                                      timeout=datetime.timedelta(seconds=max(CONTROL_TIMEOUT, cfg.dist_timeout)))
        self._gathered: tuple[int, dict | None] | None = None
        # a checkpoint fixes the number of ranks and the placement
        self.manifest = self.together(self._read_manifest)
        placement = self.manifest["placement"] if self.manifest else cfg.placement

        def read_data():
            if not self.is_main:
                return None
            self.data = load_data(cfg)
            return self.data.train.num_batches, self.data.num_classes, self.data.stem

        B, num_classes, stem = self.share(self.together(read_data))
        self.batches_per_epoch = B
        self.model = make_model(cfg, num_classes, stem)

        def get_batch(mb: int):
            return self.data.train.batch(mb // B, mb % B)

        self.pipe = self.together(lambda: DistributedPipeline(
            self.model, cfg.method, num_batches=cfg.epochs * B, get_batch=get_batch if self.is_main else None,
            batch_size=cfg.batch_size, k=cfg.k, recipe=recipe_of(cfg), batches_per_epoch=B, placement=placement,
            device=self.device, timeout=cfg.dist_timeout))

    def _read_manifest(self) -> dict | None:
        if not self.checkpoint_path.exists():
            return None
        manifest = runio.load_checkpoint(self.checkpoint_path)
        if manifest.get("runtime") != "distributed":
            raise ConfigError(f"{self.checkpoint_path} was written by runtime=simulator; resume it with that runtime")
        check_same_run(self.checkpoint_path, manifest.get("config"), self.cfg)
        if manifest["world_size"] != self.world_size:
            raise ConfigError(f"{self.checkpoint_path} was written by {manifest['world_size']} ranks, this launch has "
                              f"{self.world_size}; resume with torchrun --nproc-per-node={manifest['world_size']}")
        return manifest

    # -- keeping ranks in step -----------------------------------------------------------------------
    def together(self, fn):
        """Run ``fn`` on every rank; if it raises on any rank, raise on every rank (ConfigError and
        DataError keep their type, so the message stays one line) — no rank is left waiting."""
        try:
            result, mine = fn(), None
        except Exception as err:  # noqa: BLE001 - handed to every rank
            result, mine = None, err
        errors: list = [None] * self.world_size
        dist.all_gather_object(errors, None if mine is None else (type(mine).__name__, str(mine)),
                               group=self.control)
        if mine is not None:
            raise mine
        for r, e in enumerate(errors):
            if e is not None:
                kind = {"ConfigError": ConfigError, "DataError": DataError, "ValueError": ValueError}.get(e[0])
                if kind is not None:
                    raise kind(e[1])
                raise RuntimeError(f"rank {r} failed: {e[0]}: {e[1]}")
        return result

    def on_main(self, fn):
        """``fn()`` on rank 0 while the other ranks wait; a failure there stops every rank."""
        return self.together(fn if self.is_main else lambda: None)

    def share(self, obj):
        """Rank 0's ``obj`` on every rank."""
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def agree(self, signal: str | None, diverged: str | None) -> tuple[str | None, str | None]:
        """Every rank's verdict at this tick boundary: stop on a signal to any rank, or on a
        non-finite loss at the head. One small all-reduce per tick."""
        from .engine.distributed import PipelineError
        from .engine.distributed.failures import _is_timeout, _short

        flags = torch.tensor([signal is not None, diverged is not None], dtype=torch.int32)
        try:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.tick_group)
            if not bool(flags.any()):
                return None, None
            notes: list = [None] * self.world_size
            dist.all_gather_object(notes, (signal, diverged), group=self.tick_group)
        except Exception as err:  # noqa: BLE001
            where = f"petra: {self.pipe.describe()}"
            if _is_timeout(err):
                message = (f"{where}: the other ranks did not finish tick {self.pipe.tick - 1} within "
                           f"{self.cfg.dist_timeout:g} s (a rank stopped responding) ({_short(err)})")
            else:
                message = (f"{where} lost contact with the other ranks at the end of tick {self.pipe.tick - 1} "
                           f"(a rank failed or was killed) ({_short(err)})")
            raise PipelineError(self.pipe.report_failure(message)) from err
        signals = [f"{s} (rank {r})" for r, (s, _) in enumerate(notes) if s]
        return (", ".join(signals) or None), next((d for _, d in notes if d), None)

    def _full_state(self) -> dict | None:
        """The whole model's state on rank 0 (gathered once per tick boundary)."""
        if self._gathered is None or self._gathered[0] != self.pipe.tick:
            self._gathered = (self.pipe.tick, self.pipe.gather_state_dict())
        return self._gathered[1]

    def all_finite(self) -> bool:
        """Are the weights and batch-norm statistics of every rank's stages finite? (collective)"""
        mine = all(finite(self.model[j]) for j in self.pipe.stages)
        verdicts: list = [None] * self.world_size
        dist.all_gather_object(verdicts, mine, group=self.control)
        return all(verdicts)

    def model_for_eval(self):
        """Rank 0: its model with every other rank's stages loaded (collective)."""
        state = self._full_state()
        if not self.is_main:
            return None
        for j, stage in enumerate(self.model):
            if j not in self.pipe.stages:  # never touch the stages in training (autograd versions)
                prefix = f"{j}."
                stage.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
                stage.to(self.device)
        return self.model

    def environment(self) -> dict:
        from .engine.placement import format_placement

        return {"runtime": "distributed", "world_size": self.world_size, "backend": dist.get_backend(),
                "placement": format_placement(self.pipe.placement)}

    # -- checkpoints -------------------------------------------------------------------------------
    def has_checkpoint(self) -> bool:
        return self.manifest is not None

    def load_checkpoint(self) -> list[dict]:
        manifest, self.manifest = self.manifest, None

        def load():
            path = self.parts_dir / manifest["parts"][self.rank]
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
        from .engine.placement import format_placement

        tick = self.pipe.tick
        pipeline = self.pipe.state_dict()  # settles the transport: nothing left on the wire
        model = self._full_state()
        names = [f"rank{r}-tick{tick}.pt" for r in range(self.world_size)]
        self.together(lambda: runio.save_checkpoint(
            self.parts_dir / names[self.rank], {"stages": self.pipe.stage_state_dicts(), "pipeline": pipeline}))

        def commit():  # rank 0, once every part is on disk
            runio.save_checkpoint(self.checkpoint_path, {
                "runtime": "distributed", "world_size": self.world_size,
                "placement": format_placement(self.pipe.placement), "tick": tick, "parts": names,
                "model": model, "history": history, "config": self.cfg.to_dict()})
            for stale in self.parts_dir.iterdir():
                if stale.name not in names:
                    stale.unlink(missing_ok=True)

        self.on_main(commit)

    def failed(self, err: BaseException) -> None:
        """Make the other ranks stop (they may be waiting for this one)."""
        from .engine.distributed import PipelineError
        from .engine.distributed.failures import _short

        if isinstance(err, PipelineError):
            return  # reported where it was raised
        message = f"petra: rank {self.rank} failed: {type(err).__name__}: {_short(err)}"
        (self.pipe.report_failure if self.pipe is not None else self.watch.report)(message)

    def close(self, ok: bool = True) -> None:
        """Stop the pipeline's threads; leave the process group (not after a failure: a broken
        group may not come apart cleanly, and the process is about to exit)."""
        if self.pipe is not None:
            self.pipe.close()
        if ok and dist.is_initialized():
            dist.destroy_process_group()


def make_runtime(cfg: RunConfig, run_dir: Path, device: torch.device):
    if cfg.runtime == "distributed":
        return DistributedRuntime(cfg, run_dir, device)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(f"runtime=simulator in a launch of {os.environ['WORLD_SIZE']} processes (WORLD_SIZE); "
                          f"add runtime=distributed, or run it as one process")
    return LocalRuntime(cfg, run_dir, device)

