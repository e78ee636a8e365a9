"""Observe a running pipeline: per stage x minibatch wall time, FLOPs, kept bytes and messages.

:class:`Recorder` is an :class:`~petra_core.engine.observers.Observer`: it adds itself to the
pipeline's ``observers`` (removed again by :meth:`Recorder.detach`) and sees each phase of each
stage through the runner's hooks (``before``/``after`` a forward, rebuild — reconstruction,
recomputation or the kept graph —, backward and step, and ``sent`` after each message). It never
changes a value, an order or a decision of the engine; it only reads the clock, the FLOP counter
and tensor sizes. It records the stages of the pipeline's first replica (``sim.workers``).

Three tidy tables (lists of dicts; ``frames()`` gives pandas DataFrames):

* ``phases``:   method, stage, kind, mb, tick, phase (forward | rebuild | backward | step),
  seconds, flops (None unless counted), flops_counted. A step (taken by the runner at the end of
  the tick) has the mb and tick of the backward that completed its accumulation group; its FLOPs
  are never counted.
* ``messages``: method, stage (sender), receiver, direction, mb, tick, activation_bytes,
  grad_bytes, labels_bytes, payload_bytes (activation + grad)
* ``kept``:     method, stage, kind, mb, tick, in_flight, buffer, reported_bytes (policy's own
  ``kept_bytes()``), held_bytes (distinct storages actually held; None unless ``walk_held``),
  taken right after each forward
"""

from __future__ import annotations

import time
from collections.abc import Collection

from torch.utils.flop_counter import FlopCounterMode

from ..engine.messages import BackwardMsg, ForwardMsg
from ..engine.observers import Observer
from ..models import streams
from .held import held_by_policy


class Recorder(Observer):
    """Attach to ``sim`` (a :class:`~petra_core.engine.Simulator` or any
    :class:`~petra_core.engine.pipeline.Pipeline`) to record what every stage does.

    ``flops_minibatches``: minibatch ids whose forward, rebuild and backward run under
    ``FlopCounterMode`` (entered right before the phase, left right after it; their times carry
    the counter's overhead and are flagged ``flops_counted``). ``walk_held``: after every forward,
    also walk what the policy really holds (exact, slower).
    """

    def __init__(self, sim, *, flops_minibatches: Collection[int] = (), walk_held: bool = False):
        self.sim, self.flops_mbs, self.walk_held = sim, set(flops_minibatches), walk_held
        self.method = sim.method.name
        self.phases: list[dict] = []
        self.messages: list[dict] = []
        self.kept: list[dict] = []
        self._workers = {id(w) for w in sim.workers}
        self._open: dict[int, tuple[float, FlopCounterMode | None]] = {}  # worker -> (start, counter) of its phase
        self._last_backward: dict[int, tuple[int, int]] = {}  # worker -> (mb, tick) of its last backward
        self.attach()

    # ---- wiring -----------------------------------------------------------------------------
    def attach(self) -> None:
        if self not in self.sim.observers:
            self.sim.observers.append(self)

    def detach(self) -> None:
        if self in self.sim.observers:
            self.sim.observers.remove(self)
        for _, counter in self._open.values():  # a phase that raised never reached its ``after``
            if counter is not None:
                counter.__exit__(None, None, None)
        self._open.clear()

    def _mine(self, w) -> bool:
        return id(w) in self._workers

    def _row(self, w, mb, tick=None, **kw) -> dict:
        return dict(
            method=self.method,
            stage=w.index,
            kind=w.stage.kind,
            mb=mb,
            tick=self.sim.tick if tick is None else tick,
            **kw,
        )

    # ---- the runner's hooks ---------------------------------------------------------------------
    def before(self, phase: str, worker, mb: int | None) -> None:
        if phase == "send":  # messages are recorded by sent(); a hand-over to the world is not a phase here
            return
        if not self._mine(worker):
            return
        stale = self._open.pop(id(worker), None)
        if stale is not None and stale[1] is not None:  # the previous phase raised: leave its counter
            stale[1].__exit__(None, None, None)
        counter = None
        if phase != "step" and mb in self.flops_mbs:
            counter = FlopCounterMode(display=False)
            counter.__enter__()
        self._open[id(worker)] = (time.perf_counter(), counter)

    def after(self, phase: str, worker, mb: int | None) -> None:
        if phase == "send" or not self._mine(worker) or id(worker) not in self._open:
            return
        t0, counter = self._open.pop(id(worker))
        secs = time.perf_counter() - t0
        flops = None
        if counter is not None:
            counter.__exit__(None, None, None)
            flops = counter.get_total_flops()
        tick = None
        if phase == "step":
            mb, tick = self._last_backward.get(id(worker), (None, None))
        elif phase == "backward":
            self._last_backward[id(worker)] = (mb, self.sim.tick)
        self.phases.append(
            self._row(worker, mb, tick, phase=phase, seconds=secs, flops=flops, flops_counted=flops is not None)
        )
        if phase == "forward":
            self._record_kept(worker, mb)

    def sent(self, worker, direction: str, msg) -> None:
        if not self._mine(worker):
            return
        # logical sizes (elements, not storages) of a tensor or a pair of streams
        act = streams.nbytes(msg.activation)
        grad = streams.nbytes(msg.grad if isinstance(msg, BackwardMsg) else None)
        labels = streams.nbytes(msg.labels if isinstance(msg, ForwardMsg) else None)
        src = worker.index
        self.messages.append(
            dict(
                method=self.method,
                stage=src,
                receiver=src + (1 if direction == "forward" else -1),
                direction=direction,
                mb=msg.mb,
                tick=self.sim.tick,
                activation_bytes=act,
                grad_bytes=grad,
                labels_bytes=labels,
                payload_bytes=act + grad,
            )
        )

    # ---- observations ---------------------------------------------------------------------------
    def _record_kept(self, w, mb) -> None:
        reported = w.storage.kept_bytes()
        held = None
        if self.walk_held:
            held = held_by_policy(w.storage, exclude=[*w.stage.parameters(), *w.stage.buffers()])
        for buf in sorted(set(reported) | set(held or {})):
            self.kept.append(
                self._row(
                    w,
                    mb,
                    in_flight=w.storage.in_flight(),
                    buffer=buf,
                    reported_bytes=reported.get(buf, 0),
                    held_bytes=None if held is None else held.get(buf, 0),
                )
            )

    def frames(self) -> dict:
        """The three tables as pandas DataFrames."""
        import pandas as pd

        return {name: pd.DataFrame(getattr(self, name)) for name in ("phases", "messages", "kept")}
