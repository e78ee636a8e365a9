"""Linear weight prediction for delayed stages (PipeMare, Yang et al. 2021; XPipe, Guan et al. 2019).

Not in the PETRA paper. Under a pipelined schedule stage j's gradient of a minibatch lands
τ_j = staleness(j) / k optimizer steps after the forward that computed it, on weights that have
moved meanwhile. Prediction runs the forward at the weights the stage is expected to hold then,
w + α · τ_j · Δw, with Δw the stage's last optimizer update and α the method's
``weight_prediction`` (1: linear extrapolation; 0: off). What each storage policy does with it:

* ``delayed`` (weight stashing): the stash is of the predicted weights, so forward and backward
  both run there — the gradient of w + τΔw, applied at w. This is
  :func:`~petra_core.methods.delayed_reference.train_delayed` with ``predict=α`` to rounding
  (tests/test_prediction.py).
* ``dsp``, ``petra``: the forward runs at the predicted weights; the backward rebuilds (recomputes,
  or inverts) with the weights the stage holds at its backward, which the prediction brought the
  forward closer to.

The live parameters are shifted in place around the forward and copied back after it (the same
bits: restoring by subtraction would not be), so every storage policy, static phases and CUDA
graphs included, runs unchanged. A stage holds two more copies of its weights: Δw and the
restore buffer (reported as ``weight_prediction`` in its kept bytes).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import Tensor


class WeightPredictor:
    """One stage's Δw, and the shift of its live weights to w + ``alpha`` · ``lag`` · Δw."""

    def __init__(self, params: list[Tensor], *, alpha: float, lag: float):
        self.params, self.scale = params, alpha * lag
        self.delta = [torch.zeros_like(p) for p in params]  # the last update; zero before the first
        self._held = [torch.empty_like(p) for p in params]  # the live weights during a shifted forward

    @torch.no_grad()
    def before_step(self) -> None:
        torch._foreach_copy_(self.delta, self.params)

    @torch.no_grad()
    def after_step(self) -> None:
        """Δw = w_after − w_before (``delta`` held w_before)."""
        torch._foreach_sub_(self.delta, self.params)
        torch._foreach_neg_(self.delta)

    @contextmanager
    def shifted(self):
        """The stage's weights at w + scale · Δw inside, the same bits as before after."""
        with torch.no_grad():
            torch._foreach_copy_(self._held, self.params)
            torch._foreach_add_(self.params, self.delta, alpha=self.scale)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self.params, self._held)

    def nbytes(self) -> int:
        return 2 * sum(p.numel() * p.element_size() for p in self.params)

    def state_dict(self) -> dict:
        return {"delta": [d.clone() for d in self.delta]}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            for d, saved in zip(self.delta, state["delta"]):
                d.copy_(saved)


def check_weight_prediction(alpha) -> float:
    """``alpha`` as a float, or one line naming it and what is allowed."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (0 <= alpha < float("inf")):
        raise ValueError(f"weight_prediction={alpha!r} must be a finite number >= 0 (1: linear prediction, 0: off)")
    return float(alpha)
