"""The experiment grid of a profile, and run identity: the one place both are defined.

A profile (``workflow/config/profiles/NAME.yaml``) holds ``train`` (``petra train`` keys shared
by every run) and ``grid`` (a list of blocks; each block is the cartesian product of its lists
over arch, method, k, seed and any other run key). ``run_name`` (optional) names a run's
directory from its config, ``{method}-k{k}-seed{seed}`` by default; a profile whose grid varies
another key puts it in the name (e.g. ``-e{epochs}``, or ``{rule_options[p]}``), a grid block may
carry its own ``run_name``, and two runs may never share a name.

:func:`runs` expands and validates a profile once and gives, per run, its name, directory
(``runs/PROFILE/DATASET/ARCH-wWIDTH/NAME``), id and resolved config. The CLI, the report,
the Snakemake rules and the DVC params generator all take runs, directories, the keys that tell
runs apart and the wildcard patterns from here.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..run.config import WATCH_KEYS, ConfigError, RunConfig, yaml_error

RUNS_ROOT = Path("runs")
CHECKPOINTS_ROOT = Path("checkpoints")  # the same tree as runs/, for checkpoints (DVC's, not git's)
PROFILES_DIR = Path("workflow/config/profiles")  # where --profile NAME is looked up (from the repository root)
RUN_NAME = "{method}-k{k}-seed{seed}"
MODEL_DIR = "{arch}-w{width}"  # an unset width (a transformer's own) leaves out -w{width}; a text size is added
# Snakemake's view of a run directory: runs/{profile}/{dataset}/{model}/{run}
RUN_DIR_PATTERN = "runs/{profile}/{dataset}/{model}/{run}"
CHECKPOINT_DIR_PATTERN = "checkpoints/{profile}/{dataset}/{model}/{run}"
WILDCARDS = {"model": r"[a-z]+[0-9]*(-w[0-9]+)?(-[a-z]+)?", "run": r"[^/]+"}
IDENTITY = ("profile", "dataset", "arch", "width", "method", "k", "seed")  # what every results row starts with

__all__ = [
    "GridRun",
    "IDENTITY",
    "RUN_DIR_PATTERN",
    "WATCH_KEYS",
    "WILDCARDS",
    "as_override",
    "default_run_dir",
    "load_profile",
    "runs",
    "varying_keys",
]


@dataclass(frozen=True)
class GridRun:
    """One run of a profile: its grid point, resolved config, name and directory."""

    profile: str
    point: dict  # the grid block's values for this run (what overrides the profile's train section)
    config: RunConfig
    name: str

    @property
    def directory(self) -> Path:
        c = self.config
        return RUNS_ROOT / self.profile / c.dataset / model_dir(c) / self.name

    @property
    def checkpoint_dir(self) -> Path:
        return CHECKPOINTS_ROOT.joinpath(*self.directory.parts[1:])

    @property
    def id(self) -> str:
        """``profile-dataset-arch-wW-name``: unique across profiles (DVC's stage key)."""
        return "-".join(self.directory.parts[1:])

    def overrides(self) -> list[str]:
        return [as_override(k, v) for k, v in sorted(self.point.items())]


def as_override(key: str, value) -> str:
    """``key=value`` as ``petra train`` parses it back (value in YAML flow style)."""
    return f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"


def profile_path(name_or_path: str | Path) -> Path:
    """A profile by path, or by name (``cpu``: ``workflow/config/profiles/cpu.yaml``)."""
    path = Path(name_or_path)
    if path.exists() or path.suffix or len(path.parts) > 1:
        return path
    named = PROFILES_DIR / f"{path.name}.yaml"
    if named.exists():
        return named
    known = sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))
    raise ConfigError(
        f"profile {str(name_or_path)!r} is neither a file nor a profile in {PROFILES_DIR}; "
        f"profiles: {', '.join(known) or 'none here (run from the repository root)'}"
    )


def load_profile(path: str | Path) -> dict:
    """A profile (a name or a path): ``profile``, ``train`` and ``grid``."""
    path = profile_path(path)
    try:
        profile = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"profile {str(path)!r} does not exist") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"profile {yaml_error(path, err)}") from None
    for key in ("profile", "train", "grid"):
        if key not in (profile or {}):
            raise ConfigError(f"profile {str(path)!r} lacks {key!r}; expected keys profile, train, grid")
    return profile


def runs(profile: dict) -> list[GridRun]:
    """Every run of the profile's grid, each validated as a full config before anything starts."""
    found: dict[Path, GridRun] = {}
    for block in profile["grid"]:
        pattern = block.get("run_name", profile.get("run_name", RUN_NAME))  # a block may name its runs its own way
        keys = sorted(k for k in block if k != "run_name")
        for combo in itertools.product(*(block[k] if isinstance(block[k], list) else [block[k]] for k in keys)):
            point = dict(zip(keys, combo))
            config = RunConfig.from_dict({**profile["train"], **point})  # fail early on a bad grid point
            try:
                name = pattern.format(**config.to_dict())
            except (KeyError, IndexError, ValueError) as err:
                raise ConfigError(
                    f"run_name {pattern!r} of profile {profile['profile']!r} is not a format of run "
                    f"config keys ({type(err).__name__}: {err}); e.g. {RUN_NAME!r}"
                ) from None
            run = GridRun(profile["profile"], point, config, name)
            if run.directory in found:
                if found[run.directory].config == config:
                    continue  # the same run listed twice
                raise ConfigError(
                    f"runs {found[run.directory].point} and {point} of profile {profile['profile']!r} "
                    f"would share {run.directory}; add the key that tells them apart to run_name "
                    f"(now {pattern!r})"
                )
            found[run.directory] = run
    return list(found.values())


def varying_keys(grid_runs: list[GridRun]) -> list[str]:
    """Run config keys whose value differs between runs, besides the identity and how a run is
    watched (e.g. ``epochs`` in a profile of training budgets): they tell results apart too."""
    configs = [r.config.to_dict() for r in grid_runs]
    return (
        [
            key
            for key in configs[0]
            if key not in IDENTITY and key not in WATCH_KEYS and any(c[key] != configs[0][key] for c in configs)
        ]
        if configs
        else []
    )


def default_run_dir(cfg: RunConfig) -> Path:
    """Where ``petra train`` puts a run given without ``--run-dir`` (no profile)."""
    return RUNS_ROOT / cfg.dataset / model_dir(cfg) / RUN_NAME.format(**cfg.to_dict())


def model_dir(cfg: RunConfig) -> str:
    """``ARCH-wWIDTH`` (a ResNet/RevNet always has a width); ``ARCH`` where the width is the arch's
    own; a text model's size appended (``revgpt-cpu``)."""
    name = cfg.arch if cfg.width is None else MODEL_DIR.format(arch=cfg.arch, width=cfg.width)
    return name if cfg.size is None else f"{name}-{cfg.size}"
