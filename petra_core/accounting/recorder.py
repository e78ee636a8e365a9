"""Observe a running simulator: per stage x minibatch wall time, FLOPs, kept bytes and messages.

:class:`Recorder` wraps (on the instances only, undone by :meth:`Recorder.detach`) each worker's
``forward``, ``backward`` and ``step`` and its storage policy's ``local_graph`` (the rebuild:
reconstruction or recomputation), and replaces the simulator's world with a
:class:`RecordingWorld` that forwards every call to the real one. It never changes a value,
an order or a decision of the engine; it only reads the clock, the FLOP counter and tensor sizes.

Three tidy tables (lists of dicts; ``frames()`` gives pandas DataFrames):

* ``phases``:   method, stage, kind, mb, tick, phase (forward | rebuild | backward | step),
  seconds, flops (None unless counted), flops_counted
* ``messages``: method, stage (sender), receiver, direction, mb, tick, activation_bytes,
  grad_bytes, labels_bytes, payload_bytes (activation + grad)
* ``kept``:     method, stage, kind, mb, tick, in_flight, buffer, reported_bytes (policy's own
  ``kept_bytes()``), held_bytes (distinct storages actually held; None unless ``walk_held``)
"""
from __future__ import annotations

import time
from collections.abc import Collection

from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from .held import held_by_policy


def payload(t: Tensor | None) -> int:
    """Bytes a tensor occupies in a message (its logical size, not its storage's)."""
    return 0 if t is None else t.numel() * t.element_size()


class RecordingWorld:
    """Forwards every call to the world ``inner``; reports each sent message to ``on_send(direction, src, msg)``."""

    def __init__(self, inner, on_send):
        self.inner, self.on_send = inner, on_send

    def send_forward(self, src, msg):
        self.on_send("forward", src, msg)
        self.inner.send_forward(src, msg)

    def send_backward(self, src, msg):
        self.on_send("backward", src, msg)
        self.inner.send_backward(src, msg)

    def recv_forward(self, dst):
        return self.inner.recv_forward(dst)

    def recv_backward(self, dst):
        return self.inner.recv_backward(dst)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class Recorder:
    """Attach to ``sim`` (a :class:`~petra_core.engine.Simulator`) to record what every stage does.

    ``flops_minibatches``: minibatch ids whose phases run under ``FlopCounterMode`` (their times
    carry the counter's overhead and are flagged ``flops_counted``). ``walk_held``: after every
    forward, also walk what the policy really holds (exact, slower).
    """

    def __init__(self, sim, *, flops_minibatches: Collection[int] = (), walk_held: bool = False):
        self.sim, self.flops_mbs, self.walk_held = sim, set(flops_minibatches), walk_held
        self.method = sim.method.name
        self.phases: list[dict] = []
        self.messages: list[dict] = []
        self.kept: list[dict] = []
        self._counter: FlopCounterMode | None = None
        self._inner_world = None
        self.attach()

    # ---- wiring -----------------------------------------------------------------------------
    def attach(self) -> None:
        for w in self.sim.workers:
            self._wrap(w)
        self._inner_world = self.sim.world
        self.sim.world = RecordingWorld(self.sim.world, self._on_send)

    def detach(self) -> None:
        for w in self.sim.workers:
            for name in ("forward", "backward", "step"):
                w.__dict__.pop(name, None)
            w.storage.__dict__.pop("local_graph", None)
        if self._inner_world is not None:
            self.sim.world = self._inner_world

    def _row(self, w, mb, **kw) -> dict:
        return dict(method=self.method, stage=w.index, kind=w.stage.kind, mb=mb, tick=self.sim.tick, **kw)

    def _wrap(self, w) -> None:
        forward, backward, step, local_graph = w.forward, w.backward, w.step, w.storage.local_graph
        state = {"rebuild": (0.0, 0), "step": 0.0}

        def timed(fn, mb, *args, **kwargs):
            count = mb in self.flops_mbs
            counter = FlopCounterMode(display=False) if count else None
            t0 = time.perf_counter()
            if counter is None:
                out = fn(*args, **kwargs)
            else:
                self._counter = counter
                with counter:
                    out = fn(*args, **kwargs)
                self._counter = None
            return out, time.perf_counter() - t0, counter.get_total_flops() if count else None

        def rec_forward(msg):
            out, secs, flops = timed(forward, msg.mb, msg)
            self.phases.append(self._row(w, msg.mb, phase="forward", seconds=secs, flops=flops,
                                         flops_counted=flops is not None))
            self._record_kept(w, msg.mb)
            return out

        def rec_local_graph(stage, mb, output, *, input_grad):
            f0 = self._counter.get_total_flops() if self._counter is not None else None
            t0 = time.perf_counter()
            graph = local_graph(stage, mb, output, input_grad=input_grad)
            secs = time.perf_counter() - t0
            flops = None if f0 is None else self._counter.get_total_flops() - f0
            state["rebuild"] = (secs, flops)
            return graph

        def rec_step():
            t0 = time.perf_counter()
            step()
            state["step"] += time.perf_counter() - t0

        def rec_backward(mb, msg):
            state["rebuild"], state["step"] = (0.0, 0), 0.0
            out, secs, flops = timed(backward, mb, mb, msg)
            r_secs, r_flops = state["rebuild"]
            counted = flops is not None
            self.phases.append(self._row(w, mb, phase="rebuild", seconds=r_secs,
                                         flops=r_flops if counted else None, flops_counted=counted))
            self.phases.append(self._row(w, mb, phase="backward", seconds=secs - r_secs - state["step"],
                                         flops=flops - r_flops if counted else None, flops_counted=counted))
            if state["step"]:
                self.phases.append(self._row(w, mb, phase="step", seconds=state["step"], flops=None,
                                             flops_counted=False))
            return out

        w.forward, w.backward, w.step, w.storage.local_graph = rec_forward, rec_backward, rec_step, rec_local_graph

    # ---- observations ---------------------------------------------------------------------------
    def _record_kept(self, w, mb) -> None:
        reported = w.storage.kept_bytes()
        held = None
        if self.walk_held:
            held = held_by_policy(w.storage, exclude=[*w.stage.parameters(), *w.stage.buffers()])
        for buf in sorted(set(reported) | set(held or {})):
            self.kept.append(self._row(w, mb, in_flight=w.storage.in_flight(), buffer=buf,
                                       reported_bytes=reported.get(buf, 0),
                                       held_bytes=None if held is None else held.get(buf, 0)))

    def _on_send(self, direction: str, src: int, msg) -> None:
        act = payload(msg.activation)
        grad = payload(getattr(msg, "grad", None))
        labels = payload(getattr(msg, "labels", None))
        self.messages.append(dict(method=self.method, stage=src, receiver=src + (1 if direction == "forward" else -1),
                                  direction=direction, mb=msg.mb, tick=self.sim.tick, activation_bytes=act,
                                  grad_bytes=grad, labels_bytes=labels, payload_bytes=act + grad))

    def frames(self) -> dict:
        """The three tables as pandas DataFrames."""
        import pandas as pd

        return {name: pd.DataFrame(getattr(self, name)) for name in ("phases", "messages", "kept")}
