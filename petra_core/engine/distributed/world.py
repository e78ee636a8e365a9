"""The world of a distributed pipeline (:class:`DistributedWorld`): this rank's composition of the
world's parts, and the check that ranks built the same model (:func:`model_fingerprint`).

The ranks form a device mesh (``torch.distributed.device_mesh.init_device_mesh``) of R replicas ×
P pipeline positions with named axes ("replica", "pipeline"); rank ``r * P + p`` is position p of
replica r (:class:`~.placement.RankPlacement`). Stage messages go point to point within a replica
(:class:`~.transport.DistributedTransport`, over edge groups this world creates and owns); the
copies of a stage meet in the replica axis' process group (:class:`~.replica_group.DistributedReplicaGroup`);
the clock, the run's collectives and failure reports are :class:`~.ranks.DistributedRanks`. It is
a composition of its own parts, not a kind of :class:`~petra_core.engine.worlds.LocalWorld`.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Sequence

import torch
import torch.distributed as dist

from ..emulation import Link
from ..worlds import Mesh, OneGroup
from .failures import DEFAULT_TIMEOUT, PipelineError, short
from .placement import RankPlacement
from .ranks import CONTROL_TIMEOUT, DistributedRanks
from .replica_group import DistributedReplicaGroup
from .transport import DistributedTransport, edge_groups


def model_fingerprint(model: torch.nn.Module) -> str:
    """SHA-1 of every parameter and buffer (ranks must build identical models)."""
    h = hashlib.sha1()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class DistributedWorld:
    """This rank's cell of the mesh of a run over torch.distributed (``replicas`` × world_size /
    ``replicas``): the process group must exist (:func:`petra_core.engine.launch.init_distributed`
    joins it from torchrun's environment). ``transport`` exists once :meth:`connect` has run."""

    def __init__(
        self,
        device: torch.device | str | None = None,
        *,
        replicas: int = 1,
        timeout: float = DEFAULT_TIMEOUT,
        control_timeout: float = CONTROL_TIMEOUT,
        link: Link | None = None,
    ):
        if not dist.is_initialized():
            raise RuntimeError(
                "a DistributedWorld needs a process group: call petra_core.engine.launch.init_distributed()"
            )
        self.backend = dist.get_backend()
        if device is None:  # NCCL: the GPU this process set (init_distributed); gloo: the CPU
            device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else "cpu"
        device = torch.device(device)
        self.timeout = timeout
        self.link = link  # every edge and replica ring an emulated link (engine/emulation.py); None: as it is
        rank, world_size = dist.get_rank(), dist.get_world_size()
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1 or world_size % replicas:
            raise ValueError(
                f"replicas={replicas!r} must divide the number of ranks ({world_size}): the mesh is "
                f"replicas x pipeline positions"
            )
        self.placement = RankPlacement(Mesh(replicas, world_size // replicas), rank, device)
        self.device_mesh = self._device_mesh()
        self.ranks = DistributedRanks(self.placement, timeout=timeout, control_timeout=control_timeout)
        # NCCL forbids issuing operations from several threads at once, even on independent
        # communicators of one device (NCCL's "Thread Safety"): the transport's sends (main thread),
        # its receives (one thread per edge) and the replica axis' collectives (main thread) are all
        # posted under this one lock. gloo is thread-safe: none.
        self.issue = threading.Lock() if self.backend == "nccl" else contextlib.nullcontext()
        self.groups = OneGroup(
            DistributedReplicaGroup(
                self.device_mesh.get_group("replica"), replicas, self.ranks.collective, issue=self.issue, link=link
            )
        )
        self.edges: dict | None = None  # the transport's process groups (connect)
        self.transport: DistributedTransport | None = None

    def _device_mesh(self):
        """torch's device mesh of this run; it must put this rank where the placement does."""
        from torch.distributed.device_mesh import init_device_mesh

        p = self.placement
        device_mesh = init_device_mesh(
            "cuda" if p.device.type == "cuda" else "cpu",
            (p.mesh.replicas, p.mesh.positions),
            mesh_dim_names=("replica", "pipeline"),
        )
        if tuple(device_mesh.get_coordinate()) != (p.replica, p.position):
            raise RuntimeError(
                f"device mesh puts rank {p.rank} at {tuple(device_mesh.get_coordinate())}, petra expects "
                f"{(p.replica, p.position)}"
            )
        return device_mesh

    def connect(self, placement: Sequence[range], schedule, backward: bool = True) -> None:
        """Open this rank's edges to its neighbours (``backward``: gradients flow back too)."""
        self.placement.connect(placement)
        if self.edges is None:
            self.edges = self.ranks.collective(
                "opening the pipeline's connections", lambda: edge_groups(self.placement.mesh, self.timeout)
            )
        self.transport = self.ranks.collective(
            "opening the pipeline's connections",
            lambda: DistributedTransport(
                self.placement,
                schedule,
                groups=self.edges,
                timeout=self.timeout,
                on_failure=self.ranks.report,
                left=self.ranks.watch.left,
                backward=backward,
                issue=self.issue,
                link=self.link,
            ),
        )
        self.ranks.barrier("opening the pipeline's connections")

    def begin_tick(self, tick: int) -> None:
        self.ranks.begin_tick(tick)
        self.transport.begin_tick(tick)

    def end_tick(self, tick: int) -> None:
        self.ranks.end_tick(tick)

    def finish(self) -> None:
        self.transport.finish()  # the watchdog keeps watching until close()

    def close(self) -> None:
        self.ranks.close()
        if self.transport is not None:
            self.transport.close()

    def leave(self, ok: bool = True) -> None:
        """Leave the process group (not after a failure: a broken group may not come apart cleanly,
        and the process is about to exit)."""
        self.close()
        if ok and dist.is_initialized():
            dist.destroy_process_group()

    def failure(self, err: BaseException, stage: int | None, tick: int) -> BaseException | None:
        """A failure here, published to every rank; None for one already published (a PipelineError)."""
        if isinstance(err, PipelineError):
            self.close()
            return None
        if self.transport is not None:
            self.transport.close()
        p = self.placement
        where = p.name_stage(stage, p.position) if stage is not None else p.describe()
        return PipelineError(
            self.ranks.report(f"petra: {where} failed at tick {tick}: {type(err).__name__}: {short(err)}")
        )
