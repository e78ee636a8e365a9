"""Messages between the GPUs of one process, copied off the compute streams.

A plain ``t.to(other_gpu)`` runs on the source GPU's current stream and, to be safe, makes that
stream wait for the destination's current stream first (and the destination wait for the copy).
With stages on several GPUs of one process this chains the GPUs together: GPU 0 cannot start
its next tick's work until the last GPU has reached the point where the copy was enqueued.

:class:`DeviceCopies` instead copies each message on a copy stream of the source GPU and one of
the destination GPU (idle streams, so the copy waits only for the producer's work), hands the
message over with a CUDA event, and the consumer's compute stream waits for that event when it
takes the message (:meth:`DeviceCopies.taken`). ``record_stream`` tells the caching allocator
which streams use each tensor, so neither copy's memory is reused early.

Host tensors are never copied here: labels stay in (pinned) host memory until the stage that
needs them (the head) copies them to its GPU itself, straight from the host. On CPU and meta
devices this is a plain ``.to``; with one device nothing is copied.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor


class DeviceCopies:
    """Copies of messages to the device of the stage that receives them (one per :class:`LocalWorld`)."""

    def __init__(self):
        self._streams: dict[torch.device, object] = {}

    def stream(self, device: torch.device):
        """The copy stream of ``device`` (made once)."""
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        return self._streams[device]

    def sent(self, msg, device: torch.device | None):
        """``msg`` with its device tensors on ``device``, and the event its copies complete at (None:
        nothing was copied between GPUs). Host tensors and tensors already there are left as they are."""
        if device is None:
            return msg, None
        event, fields = None, {}
        for f in dataclasses.fields(msg):
            t = getattr(msg, f.name)
            if not isinstance(t, Tensor) or t.device == device or t.device.type == "cpu":
                continue
            if t.device.type == "cuda" and device.type == "cuda":
                fields[f.name] = self._gpu_to_gpu(t, device)
                event = event or True
            else:  # meta, or a GPU tensor for a stage on the CPU
                fields[f.name] = t.to(device)
        if event:
            event = torch.cuda.Event()
            event.record(self.stream(device))
        return (dataclasses.replace(msg, **fields) if fields else msg), event

    def _gpu_to_gpu(self, t: Tensor, device: torch.device) -> Tensor:
        src, dst = self.stream(t.device), self.stream(device)
        src.wait_stream(torch.cuda.current_stream(t.device))  # the producer's kernels wrote t
        with torch.cuda.stream(src), torch.cuda.stream(dst):  # both devices' current streams: the copy streams
            out = t.to(device, non_blocking=True)
        t.record_stream(src)  # t's memory is not reused while the copy may still read it
        return out

    @staticmethod
    def taken(msg, event, device: torch.device | None):
        """The consumer's side: its compute stream waits for the copies of ``msg``, and each copied
        tensor is marked as used by that stream."""
        if event is None:
            return msg
        stream = torch.cuda.current_stream(device)
        stream.wait_event(event)
        for f in dataclasses.fields(msg):
            t = getattr(msg, f.name)
            if isinstance(t, Tensor) and t.device == device:
                t.record_stream(stream)
        return msg
