"""Stage messages within a replica (:class:`Transport`), and the in-process one (:class:`LocalTransport`).

A message sent at tick t is received at t + 1; at a tick boundary ``state_dict`` holds every
message sent and not yet consumed, so a checkpoint resumes the pipeline exactly.
:class:`LocalTransport` keeps one FIFO per (replica, direction, receiving stage) and moves each
message to the receiving stage's device as it is sent (``copies.py``). The distributed transport
(``distributed/transport.py``) hands the messages between two stages of its own rank to one.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Protocol

import torch

from ..copies import DeviceCopies
from ..messages import BackwardMsg, ForwardMsg, saved
from .placement import Placement


class Transport(Protocol):
    """Point to point between the stages of one replica; ``replica`` names which."""

    def send_forward(self, replica: int, src: int, msg: ForwardMsg) -> None: ...
    def recv_forward(self, replica: int, dst: int) -> ForwardMsg: ...
    def send_backward(self, replica: int, src: int, msg: BackwardMsg) -> None: ...
    def recv_backward(self, replica: int, dst: int) -> BackwardMsg: ...
    def begin_tick(self, tick: int) -> None: ...
    def finish(self) -> None: ...
    def close(self) -> None: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


class LocalTransport:
    """In-process FIFOs; ``placement`` says which device each receiving stage is on."""

    def __init__(self, placement: Placement):
        self.placement = placement
        self.queues: dict[tuple[int, str, int], deque] = defaultdict(deque)  # of (message, copy event)
        self.copies = DeviceCopies()
        self.takers_own_streams = False  # stage streams: a taker marks what it takes as used by its stream

    def send_forward(self, replica: int, src: int, msg: ForwardMsg) -> None:
        self._put((replica, "forward", src + 1), msg)

    def recv_forward(self, replica: int, dst: int) -> ForwardMsg:
        return self._take((replica, "forward", dst))

    def send_backward(self, replica: int, src: int, msg: BackwardMsg) -> None:
        self._put((replica, "backward", src - 1), msg)

    def recv_backward(self, replica: int, dst: int) -> BackwardMsg:
        return self._take((replica, "backward", dst))

    def _put(self, key: tuple, msg) -> None:
        self.queues[key].append(self.copies.sent(msg, self.placement.device_for(key[2])))

    def _take(self, key: tuple):
        msg, event = self.queues[key].popleft()
        return self.copies.taken(msg, event, self.placement.device_for(key[2]), record=self.takers_own_streams)

    def begin_tick(self, tick: int) -> None:  # a message is in its FIFO as soon as it is sent
        pass

    def finish(self) -> None:  # nothing in flight outside the FIFOs
        pass

    def close(self) -> None:  # nothing to release
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
            device = self.placement.device_for(key[2]) if self.placement.ranges else None
            for name, fields in msgs:
                if device is not None:
                    fields = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in fields.items()}
                self.queues[key].append((kinds[name](**fields), None))
