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


def locked():
    """{name: version} of .ci/constraints.txt, and the Python it was locked on."""
    text = (ROOT / ".ci" / "constraints.txt").read_text()
    python = re.search(r"^# python (\d+\.\d+):", text, re.M)
    pins = dict(re.match(r"^([A-Za-z0-9_.-]+)==(\S+)$", line).groups() for line in text.splitlines() if "==" in line)
    return {re.sub(r"[-_.]+", "-", k).lower(): v for k, v in pins.items()}, python and python.group(1)


def test_the_lock_pins_every_dependency_and_extra_and_the_torch_pair_setup_installs():
    """.ci/setup installs with .ci/constraints.txt (written by .ci/lock): every package of
    pyproject.toml, extras included, has one exact version there, within pyproject's range, and
    torch/torchvision are the pair .ci/setup names."""
    from packaging.specifiers import SpecifierSet

    pins, python = locked()
    assert python, ".ci/constraints.txt names no '# python X.Y:' line"
    core, extras = pyproject()
    wanted = {**core, **{k: v for extra in extras.values() for k, v in extra.items()}}
    for name, bound in wanted.items():
        key = re.sub(r"[-_.]+", "-", name).lower()
        assert key in pins, f"{name} is not pinned in .ci/constraints.txt (run .ci/lock)"
        assert SpecifierSet(bound).contains(pins[key].split("+")[0], prereleases=True), (name, bound, pins[key])
    setup = (ROOT / ".ci" / "setup").read_text()
    for name in ("torch", "torchvision"):
        assert f'"{name}=={pins[name]}"' in setup, f"{name}: .ci/setup and .ci/constraints.txt disagree"
    assert "petra" not in pins  # the project itself is installed editable, never pinned
