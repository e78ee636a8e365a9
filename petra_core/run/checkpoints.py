"""A run's checkpoint: ``checkpoint.pt`` and, in a distributed run, its parts by mesh coordinate.

``checkpoint.pt`` (in the run directory, or in a separate checkpoint directory: profile runs keep
theirs under ``checkpoints/``, where DVC versions them) holds replica 0's whole model, the
history, the config, the mesh (replicas × pipeline positions) and the placement. In one process
it also holds every other replica's model and the in-flight pipeline (queued activations and
gradients, buffers, stashes, optimizer and scheduler state). In a distributed run every rank
first writes its own stages and in-flight state to
``checkpoint-parts/replica{r}-position{p}-tick{t}.pt``; rank 0's ``checkpoint.pt`` (naming the
parts by coordinate) then commits the checkpoint, and older parts are deleted after that.
"""
from __future__ import annotations

from pathlib import Path

from ..engine.placement import format_placement
from . import runio
from .config import ConfigError, RunConfig, check_same_run

PARTS = "checkpoint-parts"


def part_name(replica: int, position: int, tick: int) -> str:
    return f"replica{replica}-position{position}-tick{tick}.pt"


class Checkpoints:
    """Reads, writes and restores the checkpoint of ``cfg``'s run in ``directory`` for ``world``."""

    def __init__(self, directory: Path, cfg: RunConfig, world):
        self.cfg, self.world = cfg, world
        self.path, self.parts_dir = Path(directory) / runio.CHECKPOINT, Path(directory) / PARTS

    def exists(self) -> bool:
        return self.path.exists()

    def read_manifest(self) -> dict | None:
        """The committed checkpoint's manifest, checked against this run and this launch (None: none)."""
        if not self.path.exists():
            return None
        manifest = runio.load_checkpoint(self.path)
        written = manifest.get("runtime", "simulator")
        if written != self.cfg.runtime:
            raise ConfigError(f"{self.path} was written by runtime={written}; resume it with that runtime")
        check_same_run(self.path, manifest.get("config"), self.cfg)
        ranks = manifest.get("world_size", 1)
        if ranks != self.world.world_size:
            raise ConfigError(f"{self.path} was written by {ranks} ranks, this launch has {self.world.world_size}; "
                              f"resume with torchrun --nproc-per-node={ranks}")
        return manifest

    def save(self, pipe, history: list[dict], model_state: dict | None) -> None:
        """Write this process's part (distributed) and, on rank 0, commit ``checkpoint.pt``
        (collective). ``model_state``: replica 0's whole model on rank 0."""
        world, tick = self.world, pipe.tick
        pipeline = pipe.state_dict()  # settles the transport: nothing left on the wire
        mesh = world.mesh
        names = None
        if world.world_size > 1:
            names = {(r, p): part_name(r, p, tick) for r in range(mesh.replicas) for p in range(mesh.positions)}
            mine = (world.replica, world.position)
            world.together(lambda: runio.save_checkpoint(self.parts_dir / names[mine], {
                "coordinate": mine, "stages": pipe.stage_state_dicts(), "pipeline": pipeline}),
                (ConfigError, ValueError))
        replicas = {} if names is not None else {rep.index: rep.model.state_dict() for rep in pipe.replicas[1:]}

        def commit():  # rank 0, once every part is on disk
            runio.save_checkpoint(self.path, {
                "runtime": self.cfg.runtime, "world_size": world.world_size, "mesh": [mesh.replicas, mesh.positions],
                "placement": format_placement(world.placement), "tick": tick, "parts": names,
                "pipeline": pipeline if names is None else None, "model": model_state, "replica_models": replicas,
                "history": history, "config": self.cfg.to_dict()})
            if names is not None:
                for stale in self.parts_dir.iterdir():
                    if stale.name not in names.values():
                        stale.unlink(missing_ok=True)

        world.on_main(commit, (ConfigError, ValueError))

    def restore(self, pipe, manifest: dict) -> list[dict]:
        """Load ``manifest``'s weights and in-flight state into ``pipe`` (collective); its history."""
        world = self.world

        def load():
            if manifest.get("parts") is None:  # one process: everything in checkpoint.pt
                pipe.model.load_state_dict(manifest["model"])
                for rep in pipe.replicas[1:]:
                    rep.model.load_state_dict(manifest["replica_models"][rep.index])
                pipe.load_state_dict(manifest["pipeline"])
                return
            parts = manifest["parts"]
            name = parts[world.rank] if isinstance(parts, list) else parts[(world.replica, world.position)]
            path = self.parts_dir / name  # a list: written before the mesh, one part per rank
            if not path.exists():
                raise ConfigError(f"{path} is missing: the checkpoint of {self.path} is incomplete")
            part = runio.load_checkpoint(path)
            if part["pipeline"]["tick"] != manifest["tick"]:
                raise ConfigError(f"{path} is of tick {part['pipeline']['tick']}, {self.path} of tick "
                                  f"{manifest['tick']}")
            for j, sd in part["stages"].items():
                pipe.model[j].load_state_dict(sd)
            pipe.load_state_dict(part["pipeline"])

        world.together(load, (ConfigError, ValueError))
        return manifest["history"]
