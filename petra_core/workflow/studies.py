"""The study registry: each study declared once, in ``workflow/studies/NAME.yaml``.

A study is a question the report answers beside the paper's Tables 1-3 (replica rules, populations,
ACCO, cyclic execution, the budget ladder, ...). Before the registry, a study was spread over the
run paths, the Snakemake rules, the report's CLI flags, dvc.yaml and the README code; now the
Snakemake rules (``workflow/rules/common.smk``), dvc.yaml (:mod:`petra_core.workflow.dvc_stages`),
``petra tables | figures | readme`` (:mod:`petra_core.report.studies`) all read the declarations
here, so adding a study is one YAML file plus its templates. Keys of a declaration:

* ``study`` (its file name) and ``about`` (one line);
* its records, one of
  - ``profile``: the profile (``workflow/config/profiles/PROFILE.yaml``) whose gathered runs it
    reads, from ``results`` (default ``results/PROFILE``; ``petra results`` writes them);
  - ``measure``: a ``command`` that writes its ``records`` into ``results`` (``{out}`` in the
    command is that directory), with the code it ``deps`` on (a Snakemake rule and a DVC stage,
    both named after the study, run it);
* ``records``: the files of ``results`` the report reads (a profile study's default:
  :data:`PROFILE_RECORDS`);
* ``load`` (``module:function``, a measured study's reader of its directory; the default reads
  every CSV and JSON record), ``tables`` and ``figures`` (output name -> ``module:function`` that
  builds the template's context or the figure, or a mapping with ``context``/``draw``, ``reads``:
  the one frame a figure takes, and keyword arguments), ``templates`` (a directory searched before
  ``petra_core/report/templates``, relative to the declaration's folder), ``readme`` (``key`` and
  ``part``: README's block).

Only YAML and paths here: the report floor and the Snakefile read it without loading pandas.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

STUDIES_DIR = Path("workflow/studies")
PROFILE_RECORDS = ("summary.csv", "results.csv", "history.csv")  # what `petra results` writes that studies read
KEYS = {
    "study",
    "about",
    "profile",
    "results",
    "measure",
    "records",
    "load",
    "tables",
    "figures",
    "templates",
    "readme",
}
MEASURE_KEYS = {"command", "deps"}


@dataclass(frozen=True)
class Study:
    """One declared study: where its records are, what renders them, how the pipeline makes them."""

    name: str
    about: str
    results: str  # its records' directory, relative to the repository root
    records: tuple[str, ...]  # the files of ``results`` it reads
    profile: str | None = None  # the profile whose gathered runs it reads (None: measured)
    command: str | None = None  # a measured study's command ({out}: ``results``)
    deps: tuple[str, ...] = ()  # the code a measured study's records depend on (DVC deps)
    load: str | None = None  # module:function reading a measured study's directory
    tables: dict = field(default_factory=dict)  # output name -> {"context": module:function, ...}
    figures: dict = field(default_factory=dict)  # output name -> {"draw": module:function, "reads": ...}
    templates: str | None = None
    readme: dict | None = None  # {"key": name in README's template, "part": module:function}

    @property
    def measured(self) -> bool:
        return self.command is not None

    @property
    def renders(self) -> bool:
        """Whether ``petra tables | figures`` read its records (a README-only study does not)."""
        return bool(self.tables or self.figures)

    def record_paths(self) -> list[str]:
        return [f"{self.results}/{name}" for name in self.records]

    def measure_command(self) -> str:
        return self.command.format(out=shlex.quote(self.results))


def _entries(path: Path, raw, what: str, key: str) -> dict:
    """``tables``/``figures``: a name -> ``module:function`` string or a mapping holding ``key``."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: {what} must map output names to {key} functions (module:function), got {raw!r}")
    out = {}
    for name, entry in raw.items():
        entry = {key: entry} if isinstance(entry, str) else entry
        if not isinstance(entry, dict) or ":" not in str(entry.get(key, "")):
            raise ValueError(f"{path}: {what}.{name} needs {key}: module:function, got {entry!r}")
        out[str(name)] = dict(entry)
    return out


def parse(path: Path, raw: dict) -> Study:
    """A :class:`Study` from one declaration; one-line ValueError naming what is wrong."""
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a study declaration is a mapping, got {type(raw).__name__}")
    unknown = sorted(set(raw) - KEYS)
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; allowed: {sorted(KEYS)}")
    name = raw.get("study")
    if name != path.stem:
        raise ValueError(f"{path} declares study {name!r}; expected {path.stem!r} (its file name)")
    profile, measure = raw.get("profile"), raw.get("measure")
    if (profile is None) == (measure is None):
        raise ValueError(f"{path}: a study has either `profile` (its runs) or `measure` (a command), not both/neither")
    measure = measure or {}
    if measure and (not isinstance(measure, dict) or set(measure) - MEASURE_KEYS or "command" not in measure):
        raise ValueError(f"{path}: measure needs `command` (and may list `deps`), got {measure!r}")
    records = tuple(raw.get("records") or (PROFILE_RECORDS if profile else ()))
    if not records:
        raise ValueError(f"{path}: a measured study lists the `records` its command writes")
    readme = raw.get("readme")
    if readme is not None and (not isinstance(readme, dict) or set(readme) != {"key", "part"}):
        raise ValueError(f"{path}: readme needs exactly `key` and `part` (module:function), got {readme!r}")
    return Study(
        name=name,
        about=str(raw.get("about", "")),
        results=str(raw.get("results") or f"results/{profile or name}"),
        records=records,
        profile=profile,
        command=measure.get("command"),
        deps=tuple(measure.get("deps") or ()),
        load=raw.get("load"),
        tables=_entries(path, raw.get("tables"), "tables", "context"),
        figures=_entries(path, raw.get("figures"), "figures", "draw"),
        templates=str(path.parent / raw["templates"]) if raw.get("templates") else None,
        readme=readme,
    )


def load(path: str | Path) -> Study:
    path = Path(path)
    return parse(path, yaml.safe_load(path.read_text()))


def load_all(studies_dir: str | Path = STUDIES_DIR) -> list[Study]:
    """Every study of ``studies_dir`` (``*.yaml``), by name; two studies may not write one output."""
    studies_dir = Path(studies_dir)
    if not studies_dir.is_dir():
        raise ValueError(f"{studies_dir} is not a directory of study declarations (NAME.yaml)")
    studies = [load(path) for path in sorted(studies_dir.glob("*.yaml"))]
    seen: dict[str, str] = {}
    for study in studies:
        for output in (*study.tables, *study.figures):
            kind = "table" if output in study.tables else "figure"
            owner = seen.setdefault(f"{kind} {output}", study.name)
            if owner != study.name:
                raise ValueError(
                    f"{studies_dir}: {kind} {output!r} is declared by studies {owner!r} and {study.name!r}"
                )
    return studies
