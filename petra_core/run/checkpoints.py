"""A run's checkpoint: ``checkpoint.pt`` and, in a distributed run, its parts by mesh coordinate.

``checkpoint.pt`` (in the run directory, or in a separate checkpoint directory: profile runs keep
theirs under ``checkpoints/``, where DVC versions them) holds replica 0's whole model, the
history, the config, the mesh (replicas × pipeline positions) and the placement. In one process
it also holds every other replica's model and the in-flight pipeline (queued activations and
gradients, buffers, stashes, optimizer and scheduler state). In a distributed run every rank
first writes its own stages and in-flight state to
``checkpoint-parts/replica{r}-position{p}-tick{t}.pt``; rank 0's ``checkpoint.pt`` (naming the
parts by coordinate) then commits the checkpoint, and older parts are deleted after that.

Nothing is lost to a damaged file: a new ``checkpoint.pt`` is read back before the one it
replaces (kept meanwhile as ``checkpoint.previous.pt``, with its parts) is deleted, and a run
whose newest checkpoint cannot be read resumes from the previous one, saying so in one line.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..engine.placement import format_placement
from . import runio
from .config import ConfigError, RunConfig, check_same_run

PARTS = "checkpoint-parts"
PREVIOUS = "checkpoint.previous.pt"  # the last checkpoint, until its successor has been read back


def part_name(replica: int, position: int, tick: int) -> str:
    return f"replica{replica}-position{position}-tick{tick}.pt"


class Checkpoints:
    """Reads, writes and restores the checkpoint of ``cfg``'s run in ``directory``. The trainer reads
    its manifest before the run's world exists; a pipeline's world writes and restores it."""

    def __init__(self, directory: Path, cfg: RunConfig):
        self.cfg = cfg
        self.path, self.parts_dir = Path(directory) / runio.CHECKPOINT, Path(directory) / PARTS
        self.previous = Path(directory) / PREVIOUS
        self.newest_damaged = False
        self.warning: str | None = None  # why the previous checkpoint is resumed from (rank 0 says it)

    def exists(self) -> bool:
        return self.path.exists() or self.previous.exists()

    def _newest_readable(self) -> tuple[Path, dict] | None:
        """(path, manifest) of the newest checkpoint that can be read: checkpoint.pt, else the
        previous one (a damaged newest is named in one line), else None."""
        damage = None
        if self.path.exists():
            try:
                return self.path, runio.load_checkpoint(self.path)
            except runio.DamagedFile as err:
                damage = err
        if self.previous.exists():
            manifest = runio.load_checkpoint(self.previous)  # damaged too: its own one-line error
            why = f"{damage}" if damage else f"{self.path} is missing (interrupted while being replaced)"
            self.warning = f"{why}; resuming from the previous checkpoint {self.previous} (tick {manifest.get('tick')})"
            self.newest_damaged = damage is not None
            return self.previous, manifest
        if damage is not None:
            raise damage
        return None

    def read_manifest(self) -> dict | None:
        """The committed checkpoint's manifest, checked against this run (None: none). Every process
        reads it alike, before any waits for another."""
        found = self._newest_readable()
        if found is None:
            return None
        _, manifest = found
        written = manifest.get("runtime", "simulator")
        if written != self.cfg.runtime:
            raise ConfigError(f"{self.path} was written by runtime={written}; resume it with that runtime")
        check_same_run(self.path, manifest.get("config"), self.cfg)
        return manifest

    def check_launch(self, manifest: dict | None, world_size: int) -> None:
        """A checkpoint resumes on as many ranks as wrote it."""
        ranks = world_size if manifest is None else manifest.get("world_size", 1)
        if ranks != world_size:
            raise ConfigError(
                f"{self.path} was written by {ranks} ranks, this launch has {world_size}; "
                f"resume with torchrun --nproc-per-node={ranks}"
            )

    def save(self, pipe, history: list[dict], model_state: dict | None, observers: dict | None = None) -> None:
        """Write this process's part (distributed) and, on rank 0, commit ``checkpoint.pt``
        (collective). ``model_state``: replica 0's whole model on rank 0; ``observers``: the state of
        rank 0's observers (the fidelity log's, simulator only)."""
        world, tick = pipe.world, pipe.tick
        pipeline = pipe.state_dict()  # settles the transport: nothing left on the wire
        mesh = world.placement.mesh
        names = None
        if world.placement.world_size > 1:
            names = {(r, p): part_name(r, p, tick) for r in range(mesh.replicas) for p in range(mesh.positions)}
            mine = (world.placement.replica, world.placement.position)
            world.ranks.together(
                lambda: runio.save_checkpoint(
                    self.parts_dir / names[mine],
                    {"coordinate": mine, "stages": pipe.stage_state_dicts(), "pipeline": pipeline},
                ),
                (ConfigError, ValueError),
            )
        replicas = {} if names is not None else {rep.index: rep.model.state_dict() for rep in pipe.replicas[1:]}

        def commit():  # rank 0, once every part is on disk
            if self.path.exists():
                if self.newest_damaged:  # never keep a damaged file as "the previous one"
                    self.path.unlink()
                else:
                    os.replace(self.path, self.previous)
            runio.save_checkpoint(
                self.path,
                {
                    "runtime": self.cfg.runtime,
                    "world_size": world.placement.world_size,
                    "mesh": [mesh.replicas, mesh.positions],
                    "placement": format_placement(world.placement.ranges),
                    "tick": tick,
                    "parts": names,
                    "pipeline": pipeline if names is None else None,
                    "model": model_state,
                    "replica_models": replicas,
                    "history": history,
                    "observers": observers,
                    "config": self.cfg.to_dict(),
                },
            )
            runio.load_checkpoint(self.path)  # read back: only then is the previous one let go
            self.newest_damaged = False
            self.previous.unlink(missing_ok=True)
            if names is not None:  # the previous checkpoint's parts too, now that this one reads back
                for stale in self.parts_dir.iterdir():
                    if stale.name not in names.values():
                        stale.unlink(missing_ok=True)

        world.ranks.on_main(commit, (ConfigError, ValueError))

    def restore(self, pipe, manifest: dict) -> list[dict]:
        """Load ``manifest``'s weights and in-flight state into ``pipe`` (collective); its history."""
        world = pipe.world

        def load():
            if manifest.get("parts") is None:  # one process: everything in checkpoint.pt
                pipe.model.load_state_dict(manifest["model"])
                for rep in pipe.replicas[1:]:
                    rep.model.load_state_dict(manifest["replica_models"][rep.index])
                pipe.load_state_dict(manifest["pipeline"])
                return
            parts = manifest["parts"]
            name = (
                parts[world.placement.rank]
                if isinstance(parts, list)
                else parts[(world.placement.replica, world.placement.position)]
            )
            path = self.parts_dir / name  # a list: written before the mesh, one part per rank
            if not path.exists():
                raise ConfigError(f"{path} is missing: the checkpoint of {self.path} is incomplete")
            part = runio.load_checkpoint(path)
            if part["pipeline"]["tick"] != manifest["tick"]:
                raise ConfigError(
                    f"{path} is of tick {part['pipeline']['tick']}, {self.path} of tick {manifest['tick']}"
                )
            for j, sd in part["stages"].items():
                pipe.model[j].load_state_dict(sd)
            pipe.load_state_dict(part["pipeline"])

        world.ranks.together(load, (ConfigError, ValueError))
        return manifest["history"]
