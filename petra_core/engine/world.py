"""The world contract (:class:`World`) and the world of one process (:class:`LocalWorld`).

A *world* is what a :class:`~petra_core.engine.pipeline.Pipeline` and the trainer need from the
processes around them. It is a mesh of R replicas × P pipeline positions (:class:`Mesh`): position
p of every replica holds the same stages (``placement[p]``), and a process holds some of its
cells. Point to point, a message stays within its replica (a message sent at tick t is received
at t + 1; the in-flight ones are in ``state_dict``). Across replicas, the copies of one stage
meet in a :class:`~petra_core.replicas.ReplicaGroup`. Over the whole world: gathers, ``share``,
``together``, ``agree`` at a tick boundary, and what a failure becomes. :class:`LocalWorld` holds
every cell in one process (the simulator); ``DistributedWorld``, one cell per rank (torch.distributed).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import Tensor

from .copies import DeviceCopies
from .messages import BackwardMsg, ForwardMsg, saved


@dataclasses.dataclass(frozen=True)
class Mesh:
    """R replicas × P pipeline positions; rank ``replica * positions + position`` (row-major, as
    ``torch.distributed.device_mesh.init_device_mesh`` with dims ("replica", "pipeline"))."""

    replicas: int = 1
    positions: int = 1

    @property
    def size(self) -> int:
        return self.replicas * self.positions

    def rank(self, replica: int, position: int) -> int:
        return replica * self.positions + position

    def coordinate(self, rank: int) -> tuple[int, int]:
        """(replica, position) of ``rank``."""
        return divmod(rank, self.positions)

    def __str__(self) -> str:
        return f"{self.replicas}x{self.positions}"


class World(Protocol):
    """What the runner and the trainer use of the processes around them (see the module docstring)."""

    mesh: Mesh
    rank: int  # this process in the whole world (0 in one process)
    position: int  # this process's pipeline position (0 in one process; stage 0 lives at position 0)
    world_size: int
    is_main: bool  # rank 0: evaluates, writes the run files, commits checkpoints
    replicas: range  # the replicas whose copies this process holds
    placement: list[range]  # stages of each pipeline position
    stages: range  # the stages this process holds (in each of its replicas)

    def connect(self, placement: Sequence[range], schedule, backward: bool = True) -> None: ...
    def device_for(self, stage: int) -> torch.device | None: ...
    def describe(self) -> str: ...
    # point to point, within a replica
    def send_forward(self, replica: int, src: int, msg: ForwardMsg) -> None: ...
    def recv_forward(self, replica: int, dst: int) -> ForwardMsg: ...
    def send_backward(self, replica: int, src: int, msg: BackwardMsg) -> None: ...
    def recv_backward(self, replica: int, dst: int) -> BackwardMsg: ...
    def begin_tick(self, tick: int) -> None: ...
    def end_tick(self, tick: int) -> None: ...
    def finish(self) -> None: ...
    def close(self) -> None: ...
    def leave(self, ok: bool = True) -> None: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...
    # across replicas
    def replica_group(self, stage: int): ...
    # the whole world
    def gather_object(self, obj, dst: int = 0) -> list | None: ...
    def share(self, obj): ...
    def all_objects(self, obj) -> list: ...
    def together(self, fn: Callable, errors=()): ...
    def on_main(self, fn: Callable, errors=()): ...
    def all_true(self, flag: bool) -> bool: ...
    def agree(self, signal: str | None, diverged: str | None, tick: int) -> tuple[str | None, str | None]: ...
    def failure(self, err: BaseException, stage: int | None, tick: int) -> BaseException | None: ...
    def report(self, message: str) -> str: ...


class LocalReplicaGroup:
    """The R copies of a stage, all in this process: their mean, summed in replica order, at once.
    ``floats_sent``: the floats each replica has put into collectives (what a rank would send)."""

    overlaps = False

    def __init__(self, size: int):
        self.size = self.local = size
        self.floats_sent = 0

    def _check(self, tensors: list[Tensor]) -> None:
        if len(tensors) != self.size:
            raise RuntimeError(f"a local replica group of {self.size} got {len(tensors)} tensors")

    def _mean(self, tensors: list[Tensor]) -> Tensor:
        self._check(tensors)
        self.floats_sent += tensors[0].numel()
        total = tensors[0].clone()
        for t in tensors[1:]:
            total += t
        return total.div_(self.size)

    def all_reduce_mean(self, tensors: list[Tensor]) -> Callable[[], None]:
        total = self._mean(tensors)
        for t in tensors:
            t.copy_(total)
        return lambda: None

    def reduce_scatter_mean(self, tensors: list[Tensor]) -> Callable[[], list[Tensor]]:
        """The mean of flat R·S floats (as :meth:`all_reduce_mean`); copy r gets slice r of it."""
        shards = list(self._mean(tensors).view(self.size, -1))
        return lambda: shards

    def all_gather(self, tensors: list[Tensor]) -> Callable[[], Tensor]:
        """Every copy's tensor (all of one shape), stacked in replica order: (R, *shape)."""
        self._check(tensors)
        self.floats_sent += tensors[0].numel()
        stacked = torch.stack(tensors)
        return lambda: stacked


class LocalWorld:
    """Every cell of the mesh in this process: R replicas of every stage, messages in one FIFO per
    (replica, direction, receiving stage). ``devices``: where the stages go, in contiguous blocks
    (e.g. every visible GPU; each replica's copy of a stage goes to the same one); None leaves them
    where they are."""

    rank, world_size, is_main, position = 0, 1, True, 0

    def __init__(self, devices: Sequence[torch.device] | None = None, *, replicas: int = 1):
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise ValueError(f"replicas must be an integer >= 1, got {replicas!r}")
        self.devices = [torch.device(d) for d in devices] if devices else None
        self.mesh = Mesh(replicas, 1)
        self.replicas = range(replicas)
        self.placement: list[range] = []
        self.queues: dict[tuple[int, str, int], deque] = defaultdict(deque)  # of (message, copy event)
        self.copies = DeviceCopies()
        self._group = LocalReplicaGroup(replicas)

    def connect(self, placement: Sequence[range], schedule=None, backward: bool = True) -> None:
        self.placement = list(placement)

    @property
    def stages(self) -> range:
        return self.placement[0]

    def device_for(self, stage: int) -> torch.device | None:
        """Where ``stage`` runs (None: where it already is)."""
        if self.devices is None:
            return None
        return self.devices[stage * len(self.devices) // len(self.stages)]

    def describe(self) -> str:
        return "this process"

    def replica_group(self, stage: int) -> LocalReplicaGroup:
        return self._group

    # ---- transport: a message goes to the receiving stage's device as it is sent (copies.py) ------
    def send_forward(self, replica: int, src: int, msg: ForwardMsg) -> None:
        self._put((replica, "forward", src + 1), msg)

    def recv_forward(self, replica: int, dst: int) -> ForwardMsg:
        return self._take((replica, "forward", dst))

    def send_backward(self, replica: int, src: int, msg: BackwardMsg) -> None:
        self._put((replica, "backward", src - 1), msg)

    def recv_backward(self, replica: int, dst: int) -> BackwardMsg:
        return self._take((replica, "backward", dst))

    def _put(self, key: tuple, msg) -> None:
        self.queues[key].append(self.copies.sent(msg, self.device_for(key[2])))

    def _take(self, key: tuple):
        msg, event = self.queues[key].popleft()
        return self.copies.taken(msg, event, self.device_for(key[2]))

    def begin_tick(self, tick: int) -> None:  # a message is in its FIFO as soon as it is sent
        pass

    def end_tick(self, tick: int) -> None:
        pass

    def finish(self) -> None:  # nothing in flight outside the FIFOs
        pass

    def close(self) -> None:  # nothing to release
        pass

    def leave(self, ok: bool = True) -> None:  # no process group to leave
        pass

    def state_dict(self) -> dict:
        for q in self.queues.values():
            for _, event in q:
                if event is not None:  # a copy between GPUs may still be running: let it land first
                    event.synchronize()
        return {key: [(type(m).__name__, saved(m)) for m, _ in q] for key, q in self.queues.items() if q}

    def load_state_dict(self, state: dict) -> None:
        """Restore the FIFOs; every tensor goes to the device of the stage that receives it (a
        checkpoint is read onto the CPU, and a message may be passed on to another GPU or rank)."""
        kinds = {"ForwardMsg": ForwardMsg, "BackwardMsg": BackwardMsg}
        self.queues.clear()
        for key, msgs in state.items():
            key = tuple(key) if len(key) == 3 else (0, *key)  # petra <= 0.1: no replica in the key
            device = self.device_for(key[2]) if self.placement else None
            for name, fields in msgs:
                if device is not None:
                    fields = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in fields.items()}
                self.queues[key].append((kinds[name](**fields), None))

    # ---- collectives (of one) -------------------------------------------------------------------
    def gather_object(self, obj, dst: int = 0) -> list:
        return [obj]

    def share(self, obj):
        return obj

    def all_objects(self, obj) -> list:
        return [obj]

    def together(self, fn: Callable, errors=()):
        return fn()

    def on_main(self, fn: Callable, errors=()):
        return fn()

    def all_true(self, flag: bool) -> bool:
        return flag

    def agree(self, signal: str | None, diverged: str | None, tick: int) -> tuple[str | None, str | None]:
        return signal, diverged

    # ---- failures -----------------------------------------------------------------------------------
    def failure(self, err: BaseException, stage: int | None, tick: int) -> BaseException | None:
        """What to raise instead of ``err`` (None: ``err`` itself; no other rank needs telling)."""
        return None

    def report(self, message: str) -> str:
        return message
