"""In-process transport: one FIFO per (direction, receiving stage).

A message sent at tick t is received at tick t + 1 (the schedule guarantees it); the FIFO order
plus the minibatch id carried by every message make a wrong delivery an immediate error. The
distributed transport (engine/distributed/transport.py) implements the same four calls over
torch.distributed point-to-point operations.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict, deque

from .messages import BackwardMsg, ForwardMsg


class InProcessTransport:
    def __init__(self):
        self.queues: dict[tuple[str, int], deque] = defaultdict(deque)

    def send_forward(self, src: int, msg: ForwardMsg) -> None:
        self.queues[("forward", src + 1)].append(msg)

    def recv_forward(self, dst: int) -> ForwardMsg:
        return self.queues[("forward", dst)].popleft()

    def send_backward(self, src: int, msg: BackwardMsg) -> None:
        self.queues[("backward", src - 1)].append(msg)

    def recv_backward(self, dst: int) -> BackwardMsg:
        return self.queues[("backward", dst)].popleft()

    def in_flight(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def state_dict(self) -> dict:
        return {key: [(type(m).__name__, dataclasses.asdict(m)) for m in q] for key, q in self.queues.items() if q}

    def load_state_dict(self, state: dict) -> None:
        kinds = {"ForwardMsg": ForwardMsg, "BackwardMsg": BackwardMsg}
        self.queues.clear()
        for key, msgs in state.items():
            self.queues[key].extend(kinds[name](**fields) for name, fields in msgs)
