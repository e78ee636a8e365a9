"""Shared by every figure module: the figure that says there is nothing to draw."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def empty_figure(message: str):
    """A figure that only says ``message`` (nothing to draw for this profile)."""
    fig, ax = plt.subplots(figsize=(5, 2))
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True)
    return fig
