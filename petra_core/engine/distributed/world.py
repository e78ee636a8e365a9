"""The world of a distributed pipeline: this rank's cell of the mesh, its transport, and the
collectives of the run.

:class:`DistributedWorld` makes the :class:`~petra_core.engine.world.World` contract work across
ranks. The ranks form a device mesh (``torch.distributed.device_mesh.init_device_mesh``) of R
replicas × P pipeline positions with named axes ("replica", "pipeline"); rank ``r * P + p`` is
position p of replica r. Stage messages go point to point within a replica (``transport.py``);
the copies of a stage meet in the replica axis' process group (:class:`DistributedReplicaGroup`);
the run's own collectives (gathers, ``share``, ``together``, the per-tick ``agree``) span the
world in two gloo groups, one bounded by ``timeout`` like every wait of the pipeline, one
generously (rank 0 may prepare data or write a checkpoint while the others wait). A collective
that breaks names the rank that is gone by its mesh coordinate (``failures.py``).
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from ..placement import format_stages
from ..world import LocalWorld, Mesh
from .failures import DEFAULT_TIMEOUT, FailureWatch, PipelineError, is_timeout, short
from .transport import DistributedTransport

CONTROL_TIMEOUT = 3600.0  # how long ranks wait for rank 0 (data preparation, evaluation, checkpoint writes)


def model_fingerprint(model: torch.nn.Module) -> str:
    """SHA-1 of every parameter and buffer (ranks must build identical models)."""
    h = hashlib.sha1()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class DistributedReplicaGroup:
    """The R copies of this rank's stages, one per replica: the replica axis of the device mesh. Its
    collectives run while the rank computes (``overlaps``: the runner completes them late)."""

    overlaps, local = True, 1

    def __init__(self, group, size: int, collective: Callable):
        self.group, self.size, self.collective = group, size, collective
        self.floats_sent = 0  # what this rank has put into the replica axis' collectives

    def all_reduce_mean(self, tensors: list) -> Callable[[], None]:
        (t,) = tensors
        self.floats_sent += t.numel()
        work = self.collective(
            "averaging with the other replicas", lambda: dist.all_reduce(t, group=self.group, async_op=True)
        )

        def wait() -> None:
            self.collective("averaging with the other replicas", work.wait)
            t.div_(self.size)

        return wait

    def reduce_scatter_mean(self, tensors: list) -> Callable[[], list]:
        (t,) = tensors
        self.floats_sent += t.numel()
        out = torch.empty(t.numel() // self.size, dtype=t.dtype, device=t.device)
        work = self.collective(
            "averaging with the other replicas",
            lambda: dist.reduce_scatter_tensor(out, t.contiguous(), group=self.group, async_op=True),
        )

        def wait() -> list:
            self.collective("averaging with the other replicas", work.wait)
            return [out.div_(self.size)]

        return wait

    def all_gather(self, tensors: list) -> Callable:
        (t,) = tensors
        self.floats_sent += t.numel()
        outs = [torch.empty_like(t) for _ in range(self.size)]
        work = self.collective(
            "gathering from the other replicas",
            lambda: dist.all_gather(outs, t.contiguous(), group=self.group, async_op=True),
        )

        def wait():
            self.collective("gathering from the other replicas", work.wait)
            return torch.stack(outs)

        return wait


class DistributedWorld(LocalWorld):
    """This rank's cell of the mesh of a run over torch.distributed (``replicas`` × world_size /
    ``replicas``): the process group must exist (:func:`petra_core.engine.launch.init_distributed`
    joins it from torchrun's environment). Messages between two stages of this rank stay in its
    local FIFOs (:class:`LocalWorld`)."""

    def __init__(
        self,
        device: torch.device | str | None = None,
        *,
        replicas: int = 1,
        timeout: float = DEFAULT_TIMEOUT,
        control_timeout: float = CONTROL_TIMEOUT,
    ):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError(
                "a DistributedWorld needs a process group: call petra_core.engine.launch.init_distributed()"
            )
        self.backend = dist.get_backend()
        if device is None:  # NCCL: the GPU this process set (init_distributed); gloo: the CPU
            device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else "cpu"
        self.device = torch.device(device)
        self.timeout = timeout
        self.tick = 0  # where this rank is, for failure reports (begin_tick)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1 or self.world_size % replicas:
            raise ValueError(
                f"replicas={replicas!r} must divide the number of ranks ({self.world_size}): the mesh is "
                f"replicas x pipeline positions"
            )
        self.mesh = Mesh(replicas, self.world_size // replicas)
        from torch.distributed.device_mesh import init_device_mesh

        self.device_mesh = init_device_mesh(
            "cuda" if self.device.type == "cuda" else "cpu",
            (self.mesh.replicas, self.mesh.positions),
            mesh_dim_names=("replica", "pipeline"),
        )
        self.replica, self.position = self.device_mesh.get_coordinate()
        if (self.replica, self.position) != self.mesh.coordinate(self.rank):
            raise RuntimeError(
                f"device mesh puts rank {self.rank} at {(self.replica, self.position)}, petra expects "
                f"{self.mesh.coordinate(self.rank)}"
            )
        self.replicas = range(self.replica, self.replica + 1)
        self.is_main = self.rank == 0
        self._group = DistributedReplicaGroup(self.device_mesh.get_group("replica"), replicas, self._collective)
        self.tick_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))
        self.control = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=max(control_timeout, timeout)))
        self.transport: DistributedTransport | None = None
        self.watch = FailureWatch(self.rank, self.describe, lambda: self.tick)
        if self.world_size > 1:
            self.watch.start()  # heartbeats from now on: a rank that dies even at start-up gets named

    @property
    def stats(self):
        return self.transport.stats if self.transport is not None else None

    @property
    def stages(self) -> range:
        return self.placement[self.position]

    def describe(self) -> str:
        return self.name_rank(self.rank)

    def device_for(self, stage: int) -> torch.device:
        return self.device

    def name_rank(self, rank: int) -> str:
        """``rank 3 (replica 1, stages 5-9)``; without replicas ``rank 1 (stages 5-9)``."""
        replica, position = self.mesh.coordinate(rank)
        where = [f"replica {replica}"] if self.mesh.replicas > 1 else []
        if self.placement:
            where.append(format_stages(self.placement[position]))
        return f"rank {rank}" + (f" ({', '.join(where)})" if where else "")

    def name_stage(self, stage: int, position: int) -> str:
        """``stage 7 of replica 1 (rank 3)``; without replicas ``stage 7 (rank 1)``."""
        of = f" of replica {self.replica}" if self.mesh.replicas > 1 else ""
        return f"stage {stage}{of} (rank {self.mesh.rank(self.replica, position)})"

    def replica_group(self, stage: int) -> DistributedReplicaGroup:
        return self._group

    def connect(self, placement: Sequence[range], schedule, backward: bool = True) -> None:
        """Open this rank's edges to its neighbours (``backward``: gradients flow back too)."""
        self.placement = list(placement)
        self.transport = self._collective(
            "opening the pipeline's connections",
            lambda: DistributedTransport(
                self.placement,
                schedule,
                position=self.position,
                mesh=self.mesh,
                replica=self.replica,
                device=self.device,
                timeout=self.timeout,
                on_failure=self.report,
                backward=backward,
                name_stage=self.name_stage,
            ),
        )
        self._collective("opening the pipeline's connections", lambda: dist.barrier(group=self.control))

    # ---- transport: local FIFOs within this rank, point to point across ranks -----------------
    def send_forward(self, replica, src, msg):
        if src + 1 in self.stages:
            super().send_forward(replica, src, msg)
        else:
            self.transport.send_forward(src, msg)

    def recv_forward(self, replica, dst):
        return super().recv_forward(replica, dst) if dst - 1 in self.stages else self.transport.recv_forward(dst)

    def send_backward(self, replica, src, msg):
        if src - 1 in self.stages:
            super().send_backward(replica, src, msg)
        else:
            self.transport.send_backward(src, msg)

    def recv_backward(self, replica, dst):
        return super().recv_backward(replica, dst) if dst + 1 in self.stages else self.transport.recv_backward(dst)

    def begin_tick(self, tick: int) -> None:
        self.tick = tick
        if self.watch.failed is not None:
            raise PipelineError(self.watch.failed)
        self.transport.begin_tick(tick)

    def end_tick(self, tick: int) -> None:
        self.tick = tick + 1  # between ticks a rank is at the next one

    def finish(self) -> None:
        self.transport.finish()  # the watchdog keeps watching until close()

    def state_dict(self) -> dict:
        """The messages sent to this rank's stages and not yet consumed (nothing is left on the wire)."""
        try:
            return {"local": super().state_dict(), **self.transport.state_dict()}
        except PipelineError:
            self.watch.stop()
            raise

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state["local"])
        self.transport.load_state_dict(state)

    def close(self) -> None:
        self.watch.close()
        if self.transport is not None:
            self.transport.close()

    def leave(self, ok: bool = True) -> None:
        """Leave the process group (not after a failure: a broken group may not come apart cleanly,
        and the process is about to exit)."""
        self.close()
        if ok and dist.is_initialized():
            dist.destroy_process_group()

    # ---- collectives ----------------------------------------------------------------------------------
    def _collective(self, what: str, fn: Callable):
        """``fn()``, a collective of every rank; if it breaks, name the rank that is gone."""
        try:
            return fn()
        except PipelineError:
            raise
        except Exception as err:  # noqa: BLE001
            silent = self.watch.silent_ranks(self.world_size)
            who = ", ".join(self.name_rank(r) for r in silent) or "another rank"
            state = (
                f"stopped responding: timed out after {self.timeout:g} s"
                if is_timeout(err) and not silent
                else "failed or was killed"
            )
            when = "" if "tick" in what else f" (tick {self.tick})"
            raise PipelineError(
                self.report(f"petra: {who} {state} while {self.describe()} was {what}{when} ({short(err)})")
            ) from err

    def gather_object(self, obj, dst: int = 0) -> list | None:
        out = [None] * self.world_size if self.rank == dst else None
        self._collective("gathering results", lambda: dist.gather_object(obj, out, dst=dst, group=self.control))
        return out

    def all_objects(self, obj) -> list:
        out: list = [None] * self.world_size
        self._collective("exchanging state", lambda: dist.all_gather_object(out, obj, group=self.control))
        return out

    def share(self, obj):
        """Rank 0's ``obj`` on every rank."""
        box = [obj]
        self._collective("sharing rank 0's state", lambda: dist.broadcast_object_list(box, src=0, group=self.control))
        return box[0]

    def all_true(self, flag: bool) -> bool:
        return all(self.all_objects(bool(flag)))

    def together(self, fn: Callable, errors: Sequence[type[BaseException]] = (ValueError,)):
        """Run ``fn`` on every rank; if it raises on any rank, raise on every rank (an error of one of
        the ``errors`` types keeps its type, so its one-line message reaches the user) — no rank is
        left waiting."""
        try:
            result, mine = fn(), None
        except Exception as err:  # noqa: BLE001 - handed to every rank
            result, mine = None, err
        reported = self.all_objects(None if mine is None else (type(mine).__name__, str(mine)))
        if mine is not None:
            raise mine
        kinds = {e.__name__: e for e in errors}
        for r, e in enumerate(reported):
            if e is not None:
                if e[0] in kinds:
                    raise kinds[e[0]](e[1])
                raise RuntimeError(f"rank {r} failed: {e[0]}: {e[1]}")
        return result

    def on_main(self, fn: Callable, errors: Sequence[type[BaseException]] = (ValueError,)):
        """``fn()`` on rank 0 while the other ranks wait; a failure there stops every rank."""
        return self.together(fn if self.is_main else lambda: None, errors)

    def agree(self, signal: str | None, diverged: str | None, tick: int) -> tuple[str | None, str | None]:
        """Every rank's verdict at the end of ``tick``: stop on a signal to any rank, or on a
        non-finite loss at the head. One small all-reduce per tick."""
        flags = torch.tensor([signal is not None, diverged is not None], dtype=torch.int32)
        notes: list = [None] * self.world_size

        def exchange() -> bool:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.tick_group)
            if bool(flags.any()):
                dist.all_gather_object(notes, (signal, diverged), group=self.tick_group)
            return bool(flags.any())

        if not self._collective(f"ending tick {tick}", exchange):
            return None, None
        signals = [f"{s} (rank {r})" for r, (s, _) in enumerate(notes) if s]
        return (", ".join(signals) or None), next((d for _, d in notes if d), None)

    # ---- failures -----------------------------------------------------------------------------------
    def report(self, message: str) -> str:
        """Publish a failure to every rank (see :class:`FailureWatch`); returns the message to raise."""
        return self.watch.report(message)

    def failure(self, err: BaseException, stage: int | None, tick: int) -> BaseException | None:
        if isinstance(err, PipelineError):
            self.close()
            return None
        if self.transport is not None:
            self.transport.close()
        where = self.name_stage(stage, self.position) if stage is not None else self.describe()
        return PipelineError(self.report(f"petra: {where} failed at tick {tick}: {type(err).__name__}: {short(err)}"))
