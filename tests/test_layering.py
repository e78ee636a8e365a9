"""The house's floors, checked on the source (issue: one runner, one run identity, a report that only reads).

* no import runs back up a floor: models never import model families, methods or the engine;
  families never import methods or the engine; the engine never imports data, config, runs, the
  report or the CLI; a run never imports the accounting; the report never imports the engine, the
  models or the accounting (it reads records);
* no module imports another module's private (underscored) name;
* one class runs ticks (``Pipeline.advance``), and ``import petra_core.report`` loads no engine code;
* the code is formatted and linted by ruff (``ruff format --check``, ``ruff check``: .ci/run), which
  replaces the line caps this file once held.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "petra_core"
FORBIDDEN = {  # floor -> the floors above it (``run.runio``, the format of run files, is usable by all)
    "models": ("families", "methods", "replicas", "engine", "accounting", "data", "run", "workflow", "report", "cli"),
    "families": ("methods", "replicas", "engine", "accounting", "data", "run", "workflow", "report", "cli"),
    "methods": ("replicas", "engine", "accounting", "data", "run", "workflow", "report", "cli"),
    "replicas": ("engine", "accounting", "data", "run", "workflow", "report", "cli"),
    "engine": ("accounting", "data", "run", "workflow", "report", "cli"),
    "accounting": ("data", "run", "workflow", "report", "cli"),
    "data": ("run", "workflow", "report", "cli"),
    # the accounting and a run both stand on the engine, neither on the other: what a run measures
    # of itself (stage costs for placement, gradient fidelity) lives with the engine
    "run": ("accounting", "workflow", "report", "cli"),
    "report": ("engine", "models", "families", "accounting", "cli"),
}


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        yield path, parts[:-1] if parts[-1] == "__init__" else parts, parts[-1] == "__init__"


def imports(path, name, is_package):
    """(imported module, imported names) of every import statement, with relative imports resolved."""
    tree = ast.parse(path.read_text())
    package = name if is_package else name[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            target = ".".join(base + (node.module.split(".") if node.module else []))
            yield target, tuple(a.name for a in node.names)


def is_module(dotted: str) -> bool:
    path = PACKAGE.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def floor(module: str) -> str | None:
    parts = module.split(".")
    if parts[:3] == ["petra_core", "run", "runio"]:
        return "runio"
    return parts[1] if len(parts) > 1 and parts[0] == "petra_core" else None


@pytest.mark.parametrize("lower", FORBIDDEN)
def test_no_import_runs_back_up_a_floor(lower):
    bad = []
    for path, name, is_package in modules():
        if floor(".".join(name)) != lower:
            continue
        for target, names in imports(path, name, is_package):
            submodules = [f"{target}.{n}" for n in names if is_module(f"{target}.{n}")]
            targets = submodules if submodules and len(submodules) == len(names) else [target, *submodules]
            bad += [f"{path.relative_to(PACKAGE.parent)} imports {t}" for t in targets if floor(t) in FORBIDDEN[lower]]
    assert not bad, "\n".join(bad)


def test_no_private_name_crosses_modules():
    bad = [
        f"{path.relative_to(PACKAGE.parent)}: from {target} import {n}"
        for path, name, is_package in modules()
        for target, names in imports(path, name, is_package)
        if target.startswith("petra_core")
        for n in names
        if n.startswith("_") and not n.startswith("__")
    ]
    assert not bad, "\n".join(bad)


def test_only_the_pipeline_runs_ticks():
    runners = [
        f"{path.relative_to(PACKAGE.parent)}: {node.name}"
        for path, _, _ in modules()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, ast.FunctionDef)
        and item.name in ("advance", "step", "run")
        and "schedule.action" in ast.unparse(item)
    ]
    assert runners == ["petra_core/engine/pipeline.py: Pipeline"], runners


@pytest.mark.slow
def test_the_report_loads_no_engine_code():
    code = (
        "import sys, petra_core.report.results, petra_core.report.tables, petra_core.report.figures; "
        "print(sorted(m for m in sys.modules if m.startswith(('petra_core.engine', 'petra_core.accounting', "
        "'petra_core.models.staged', 'petra_core.models.blocks'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
