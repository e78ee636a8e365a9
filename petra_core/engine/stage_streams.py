"""One CUDA stream per stage in one process (``stage_streams``), so the stages' kernels of a tick
can run at the same time, on one GPU or several.

Within a tick the stages of a pipelined schedule are independent: every message a stage takes was
sent at an earlier tick (``worlds/transport.py``). On the default stream their kernels still run
one stage after another. :class:`StageStreams` gives each stage its own stream and orders them at
tick boundaries only:

* before a stage acts, its stream waits for its device's default stream (everything the runner
  queued there: the previous tick's steps, a loaded checkpoint, an evaluation);
* after the tick's last action, each device's default stream waits for every stage stream on it,
  so the steps of the tick, the head's log, checkpoints and evaluation (all on the default stream)
  see the tick's work complete;
* a message made on one stage's stream and read on another's is marked as used by the reader
  (``record_stream``), so the caching allocator does not hand its memory back to the writer's
  stream while the reader may still read it (the one-process transport's ``takers_own_streams``).

No kernel changes, only the streams they are queued on: the bits are the default stream's
(``tests/test_stage_streams.py``; its GPU tests compare them). The waits are stream-to-stream
(no host synchronisation). One replica per process, on a one-process world: replica rules touch
every copy of a stage on the default stream mid-tick, and a rank's received messages arrive on
NCCL's streams, orderings this module does not make.
"""

from __future__ import annotations

import contextlib

import torch


def check_stage_streams(on: object, *, devices=(), replicas: int = 1, one_process: bool = True) -> bool:
    """``on`` if stage streams can run here (``devices``: the stages'); one line otherwise."""
    if not isinstance(on, bool):
        raise ValueError(f"stage_streams={on!r} is not allowed; allowed: true, false")
    if not on:
        return on
    if replicas != 1:
        raise ValueError(f"stage_streams=true runs one replica per process, not {replicas}: use stage_streams=false")
    if not one_process:
        raise ValueError(
            "stage_streams=true runs in one process (the simulator), not on ranks: use stage_streams=false"
        )
    kinds = sorted({torch.device(d).type for d in devices} - {"cuda"})
    if kinds:
        raise ValueError(f"stage_streams=true gives CUDA stages streams; stages are on {', '.join(kinds)}: use false")
    return on


class StageStreams:
    """A stream per stage worker (on its device), entered for its actions, joined at tick end."""

    def __init__(self, workers):
        self.streams = {id(w): torch.cuda.Stream(w.device) for w in workers}
        self.devices = sorted({w.device for w in workers}, key=str)

    def acting(self, worker):
        """The context a stage's action runs in: its stream, after the runner's (the current) stream's work."""
        stream = self.streams[id(worker)]
        stream.wait_stream(torch.cuda.current_stream(worker.device))
        return torch.cuda.stream(stream)

    def join(self) -> None:
        """Each device's current stream (the runner's) waits for the tick's work on every stage stream."""
        for device in self.devices:
            default = torch.cuda.current_stream(device)
            for stream in self.streams.values():
                if stream.device == device:
                    default.wait_stream(stream)


class NoStageStreams:
    """Every stage on its device's current stream (the default): nothing to enter or join."""

    streams: dict = {}

    @staticmethod
    def acting(worker):
        return contextlib.nullcontext()

    @staticmethod
    def join() -> None:
        pass
