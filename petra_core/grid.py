"""The experiment grid of a profile: which runs exist and where their records live.

A profile (``workflow/config/profiles/NAME.yaml``) holds ``train`` (``petra train`` keys shared
by every run) and ``grid`` (a list of blocks; each block is the cartesian product of its lists
over arch, method, k, seed and any other run key). ``run_name`` (optional) names a run's
directory from its config, ``{method}-k{k}-seed{seed}`` by default; a profile whose grid varies
another key puts it in the name (e.g. ``-e{epochs}``), and two runs may never share a name. Snakemake, DVC, the report and the tests all
read the grid through this module, so it is defined once.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import yaml

from .config import ConfigError, RunConfig

RUNS_ROOT = Path("runs")
RUN_NAME = "{method}-k{k}-seed{seed}"


@dataclass(frozen=True)
class Run:
    profile: str
    values: tuple[tuple[str, object], ...]  # the grid point (sorted key, value pairs)
    name_pattern: str = RUN_NAME

    @property
    def point(self) -> dict:
        return dict(self.values)

    def name(self, base: dict) -> str:
        return self.name_pattern.format(**{**base, **self.point})

    def directory(self, base: dict) -> Path:
        p = {**base, **self.point}
        return RUNS_ROOT / self.profile / p["dataset"] / f"{p['arch']}-w{p['width']}" / self.name(base)

    def overrides(self) -> list[str]:
        return [as_override(k, v) for k, v in self.values]


def as_override(key: str, value) -> str:
    """``key=value`` as ``petra train`` parses it back (value in YAML flow style)."""
    return f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"


def load_profile(path: str | Path) -> dict:
    path = Path(path)
    try:
        profile = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"profile {str(path)!r} does not exist") from None
    for key in ("profile", "train", "grid"):
        if key not in (profile or {}):
            raise ConfigError(f"profile {str(path)!r} lacks {key!r}; expected keys profile, train, grid")
    return profile


def expand(profile: dict) -> list[Run]:
    """Every run of the profile's grid, each validated as a full config before anything starts."""
    runs: list[Run] = []
    pattern = profile.get("run_name", RUN_NAME)
    names: dict[Path, Run] = {}
    for block in profile["grid"]:
        keys = sorted(block)
        for combo in itertools.product(*(block[k] if isinstance(block[k], list) else [block[k]] for k in keys)):
            run = Run(profile["profile"], tuple(zip(keys, combo)), pattern)
            base = RunConfig.from_dict({**profile["train"], **run.point}).to_dict()  # fail early on a bad point
            if run in runs:
                continue
            try:
                where = run.directory(base)
            except (KeyError, IndexError, ValueError) as err:
                raise ConfigError(f"run_name {pattern!r} of profile {profile['profile']!r} is not a format of run "
                                  f"config keys ({type(err).__name__}: {err}); e.g. {RUN_NAME!r}") from None
            if where in names:
                raise ConfigError(f"runs {names[where].point} and {run.point} of profile {profile['profile']!r} "
                                  f"would share {where}; add the key that tells them apart to run_name "
                                  f"(now {pattern!r})")
            names[where] = run
            runs.append(run)
    return runs


def run_dirs(profile: dict) -> list[Path]:
    base = RunConfig.from_dict(profile["train"]).to_dict()
    return [run.directory(base) for run in expand(profile)]
