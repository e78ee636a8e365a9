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
        """``msg`` with its device tensors on ``device`` (a RevNet's pair of streams tensor by
        tensor), and the event its copies complete at (None: nothing was copied between GPUs). Host
        tensors and tensors already there are left as they are."""
        if device is None:
            return msg, None
        copied, fields = False, {}
        for f in dataclasses.fields(msg):
            value = getattr(msg, f.name)
            if isinstance(value, tuple):
                moved = tuple([self._moved(t, device) for t in value])
                if any(m is not t for m, t in zip(moved, value)):
                    fields[f.name], copied = moved, copied or any(_between_gpus(t, device) for t in value)
            elif isinstance(value, Tensor):
                moved = self._moved(value, device)
                if moved is not value:
                    fields[f.name], copied = moved, copied or _between_gpus(value, device)
        event = None
        if copied:
            event = torch.cuda.Event()
            event.record(self.stream(device))
        return (dataclasses.replace(msg, **fields) if fields else msg), event

    def _moved(self, t: Tensor, device: torch.device) -> Tensor:
        """``t`` on ``device``: itself when it is there or on the host, else a copy."""
        if t.device == device or t.device.type == "cpu":
            return t
        if _between_gpus(t, device):
            return self._gpu_to_gpu(t, device)
        return t.to(device)  # meta, or a GPU tensor for a stage on the CPU

    def _gpu_to_gpu(self, t: Tensor, device: torch.device) -> Tensor:
        src, dst = self.stream(t.device), self.stream(device)
        src.wait_stream(torch.cuda.current_stream(t.device))  # the producer's kernels wrote t
        with torch.cuda.stream(src), torch.cuda.stream(dst):  # both devices' current streams: the copy streams
            out = t.to(device, non_blocking=True)
        t.record_stream(src)  # t's memory is not reused while the copy may still read it
        return out

    @staticmethod
    def taken(msg, event, device: torch.device | None, record: bool = False):
        """The consumer's side: its compute stream waits for the copies of ``msg``, and each copied
        tensor is marked as used by that stream (``record``: every CUDA tensor of ``msg``, for a
        consumer on another stream than the producer of the same GPU, as with stage streams)."""
        if event is None and not record:
            return msg
        stream = torch.cuda.current_stream(device)
        if event is not None:
            stream.wait_event(event)
        for f in dataclasses.fields(msg):
            value = getattr(msg, f.name)
            for t in value if isinstance(value, tuple) else (value,):
                if isinstance(t, Tensor) and t.device == device and (record or event is not None):
                    t.record_stream(stream)
        return msg


def _between_gpus(t: Tensor, device: torch.device) -> bool:
    return t.device.type == "cuda" and device.type == "cuda" and t.device != device
