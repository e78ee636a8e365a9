"""The paper's reference numbers (``paper_reference.yaml``, package data): the one place they live."""
from __future__ import annotations

from pathlib import Path

import yaml

from ..accounting.reference import REFERENCE_FILE  # where the file lives is said once, below the report
SECTIONS = ("table1", "table2", "table3", "figure4", "recipe")


def load_paper_reference(path: str | Path = REFERENCE_FILE) -> dict:
    """The whole reference file, checked to hold every section the report reads."""
    data = yaml.safe_load(Path(path).read_text())
    absent = [s for s in SECTIONS if s not in (data or {})]
    if absent:
        raise KeyError(f"{path}: missing section(s) {', '.join(absent)}; expected {', '.join(SECTIONS)}")
    return data
