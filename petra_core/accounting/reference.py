"""The paper's reference numbers, kept as data (``paper_table1.yaml``, ``paper_table3.yaml``)."""
from __future__ import annotations

import ast
import operator
from pathlib import Path

import yaml

HERE = Path(__file__).parent


def load_reference(name: str) -> dict:
    """``load_reference("paper_table1")`` -> the parsed YAML file beside this module."""
    return yaml.safe_load((HERE / f"{name}.yaml").read_text())


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate(expr: str | float, **names: float) -> float:
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
