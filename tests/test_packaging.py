"""The environment files say what pyproject.toml says: environment.yml (conda, the development
environment: every dependency and extra) and workflow/envs/petra.yaml (Snakemake's rules: the core)."""

import re
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONDA_NAMES = {"pytorch": "torch"}  # conda-forge name -> PyPI name


def requirements(specs):
    """{name: version bound} of requirement strings like 'torch>=2.4' or conda's 'pytorch >=2.4'."""
    out = {}
    for spec in specs:
        name, bound = re.match(r"^\s*([A-Za-z0-9_.-]+)\s*(.*?)\s*$", spec).groups()
        out[CONDA_NAMES.get(name, name).lower()] = bound.replace(" ", "")
    return out


def pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return requirements(project["dependencies"]), {
        extra: requirements(specs) for extra, specs in project["optional-dependencies"].items()
    }


def conda(path):
    deps = yaml.safe_load(path.read_text())["dependencies"]
    found = requirements(d for d in deps if isinstance(d, str))
    pip = next((d["pip"] for d in deps if isinstance(d, dict)), [])
    return {k: v for k, v in found.items() if k not in ("python", "pip")}, found, pip


def test_environment_yml_lists_what_pyproject_lists():
    core, extras = pyproject()
    wanted = {**core, **{k: v for specs in extras.values() for k, v in specs.items()}}
    listed, everything, pip = conda(ROOT / "environment.yml")
    assert listed == wanted
    assert "pip" in everything and everything["python"] == ">=3.10"
    assert "-e ." in pip  # the project itself, editable
    assert yaml.safe_load((ROOT / "environment.yml").read_text())["channels"][0] == "conda-forge"


def test_the_rules_environment_has_the_core_dependencies():
    core, _ = pyproject()
    listed, _, _ = conda(ROOT / "workflow" / "envs" / "petra.yaml")
    assert listed == core
