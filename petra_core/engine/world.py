"""What crosses processes, for a pipeline that lives in one: the trivial world.

A *world* is what a :class:`~petra_core.engine.pipeline.Pipeline` and the trainer need from the
processes around them: the placement of stages on ranks and this ``rank``; the transport (sends
and receives: a message sent at tick t is received at t + 1, and its in-flight ``state_dict``);
collectives (``gather_object``, ``share``, ``together``, ``agree`` at a tick boundary); and what
a failure becomes (``failure``). :class:`LocalWorld` is the simulator's: FIFOs and collectives
of one; ``DistributedWorld`` is the same over torch.distributed.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict, deque
from collections.abc import Callable, Sequence

import torch

from .messages import BackwardMsg, ForwardMsg


class LocalWorld:
    """Every stage in this process, messages in one FIFO per (direction, receiving stage). ``devices``:
    where the stages go, in contiguous blocks (e.g. every visible GPU); None leaves them where they are."""

    rank, world_size, is_main = 0, 1, True

    def __init__(self, devices: Sequence[torch.device] | None = None):
        self.devices = [torch.device(d) for d in devices] if devices else None
        self.placement: list[range] = []
        self.stage_costs = None
        self.clock = lambda: 0  # the pipeline's tick (its runner sets this)
        self.queues: dict[tuple[str, int], deque] = defaultdict(deque)

    def connect(self, placement: Sequence[range], schedule=None, backward: bool = True) -> None:
        self.placement = list(placement)

    @property
    def stages(self) -> range:
        return self.placement[self.rank]

    def device_for(self, stage: int) -> torch.device | None:
        """Where ``stage`` runs (None: where it already is)."""
        if self.devices is None:
            return None
        return self.devices[stage * len(self.devices) // len(self.stages)]

    def describe(self) -> str:
        return "this process"

    # ---- transport ---------------------------------------------------------------------------
    def send_forward(self, src: int, msg: ForwardMsg) -> None:
        self.queues[("forward", src + 1)].append(msg)

    def recv_forward(self, dst: int) -> ForwardMsg:
        return self.queues[("forward", dst)].popleft()

    def send_backward(self, src: int, msg: BackwardMsg) -> None:
        self.queues[("backward", src - 1)].append(msg)

    def recv_backward(self, dst: int) -> BackwardMsg:
        return self.queues[("backward", dst)].popleft()

    def begin_tick(self, tick: int) -> None:  # a message is in its FIFO as soon as it is sent
        pass

    def finish(self) -> None:  # nothing in flight outside the FIFOs
        pass

    def close(self) -> None:  # nothing to release
        pass

    def state_dict(self) -> dict:
        return {key: [(type(m).__name__, dataclasses.asdict(m)) for m in q] for key, q in self.queues.items() if q}

    def load_state_dict(self, state: dict) -> None:
        kinds = {"ForwardMsg": ForwardMsg, "BackwardMsg": BackwardMsg}
        self.queues.clear()
        for key, msgs in state.items():
            self.queues[key].extend(kinds[name](**fields) for name, fields in msgs)

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
