"""The paper's reference numbers, kept as data in ONE file: ``petra_core/paper_reference.yaml``.

It lives below both of its readers (accounting: Tables 1 and 3; report: every table and figure)
and this is its one loader.
"""

from __future__ import annotations

import ast
import operator
from functools import lru_cache
from pathlib import Path

import yaml

REFERENCE_FILE = Path(__file__).resolve().parent / "paper_reference.yaml"
SECTIONS = ("table1", "table2", "table3", "figure4", "budget", "recipe")


@lru_cache(maxsize=4)
def _read(path: str) -> dict:
    data = yaml.safe_load(Path(path).read_text())
    absent = [s for s in SECTIONS if s not in (data or {})]
    if absent:
        raise KeyError(f"{path}: missing section(s) {', '.join(absent)}; expected {', '.join(SECTIONS)}")
    return data


def load_paper_reference(path: str | Path = REFERENCE_FILE) -> dict:
    """The whole reference file, checked to hold every section its readers use."""
    return _read(str(path))


def load_reference(name: str) -> dict:
    """``load_reference("paper_table1")`` (or ``"table1"``) -> that section of the reference file."""
    key = name.removeprefix("paper_")
    data = load_paper_reference()
    if key not in data or not isinstance(data[key], dict):
        sections = ", ".join(k for k, v in data.items() if isinstance(v, dict))
        raise KeyError(f"{name!r}: no such section in {REFERENCE_FILE.name}; sections: {sections}")
    return data[key]


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate_formula(expr: str | float, **names: float) -> float:
    """Evaluate a Table 1 entry such as ``"2*(J-j)/k"`` (numbers, names, + - * / and brackets only)."""

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise ValueError(f"{expr!r}: unknown name {node.id!r}; given: {', '.join(names)}")
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"unsupported expression {expr!r}")

    return float(ev(ast.parse(str(expr), mode="eval")))
