"""Reading the measured cost tables (``results/costs/``, written by ``petra costs``)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..run.runio import COST_FILES


def load(costs_dir: str | Path) -> dict:
    """{table name: DataFrame} of every CSV, and ``info`` (costs.json: settings and machine)."""
    costs_dir = Path(costs_dir)
    out = {name.removesuffix(".csv"): pd.read_csv(costs_dir / name) for name in COST_FILES if name.endswith(".csv")}
    out["info"] = json.loads((costs_dir / "costs.json").read_text())
    return out
