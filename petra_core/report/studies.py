"""The report's side of the study registry (:mod:`petra_core.workflow.studies`): read each study's
records and build its tables' contexts and its figures with the functions its declaration names,
so ``petra tables | figures | readme`` render a new study without a line of report code changing.

A profile study's builders take ``(frames, profile)`` (a figure that ``reads`` one frame takes that
frame instead of all); a measured study's take what its ``load`` returns. A study with no records
yet is rendered as such (empty frames, or ``None``): its template says so.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from ..workflow.studies import Study


def resolve(spec: str):
    """The object ``module:attr`` names (a declaration's builder)."""
    module, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{spec!r} names no importable function (module:function): {err}") from None


def read_records(directory: str | Path, records: tuple[str, ...]) -> dict | None:
    """A measured study's records by stem (CSV: DataFrame, JSON: its value); None until all exist."""
    import pandas as pd

    directory = Path(directory)
    if not all((directory / name).exists() for name in records):
        return None
    return {
        Path(name).stem: pd.read_csv(directory / name)
        if name.endswith(".csv")
        else json.loads((directory / name).read_text())
        for name in records
    }


def rows_context(records: dict | None, table: str, columns: list[str]) -> dict:
    """A plain results table: ``columns`` of the record ``table``, one row per line (the builder a
    new study can name before it has its own)."""
    if records is None:
        return {"applies": False, "columns": columns, "rows": []}
    frame = records[table]
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"record {table!r} has no columns {missing}; it has {list(frame.columns)}")
    return {"applies": True, "columns": columns, "rows": frame[columns].to_dict("records")}


def source(study: Study, directory: str | Path | None = None) -> tuple:
    """The arguments every builder of ``study`` starts with, read from ``directory`` (default: its
    declared results directory)."""
    directory = Path(directory or study.results)
    if study.measured:
        return (resolve(study.load)(directory) if study.load else read_records(directory, study.records),)
    from .replicas import load

    frames, profile = load(directory, study.records)
    return frames, profile


def _call(entry: dict, key: str, args: tuple):
    options = {k: v for k, v in entry.items() if k not in (key, "reads")}
    if "reads" in entry:  # a figure drawn from one frame of a profile study
        args = (args[0][entry["reads"]], *args[1:])
    return resolve(entry[key])(*args, **options)


def contexts(studies: list[Study], dirs: dict[str, str | Path] | None = None) -> dict[str, tuple[Study, dict]]:
    """Table name -> (its study, its template's context), for every table of ``studies``;
    ``dirs`` overrides a study's records directory by name."""
    out = {}
    for study in (s for s in studies if s.tables):
        args = source(study, (dirs or {}).get(study.name))
        for name, entry in study.tables.items():
            out[name] = (study, _call(entry, "context", args))
    return out


def figures(studies: list[Study], dirs: dict[str, str | Path] | None = None) -> dict:
    """Figure name -> the figure, for every figure of ``studies`` (``dirs`` as in :func:`contexts`)."""
    out = {}
    for study in (s for s in studies if s.figures):
        args = source(study, (dirs or {}).get(study.name))
        for name, entry in study.figures.items():
            out[name] = _call(entry, "draw", args)
    return out


def readme_parts(studies: list[Study], results_root: Path) -> dict:
    """README's template context of every study with a ``readme`` part: the part of its gathered
    results (``results_root/PROFILE``), None where they are not gathered."""
    from . import results as results_mod

    out = {}
    for study in (s for s in studies if s.readme):
        directory = results_root / Path(study.results).name
        if study.measured:
            out[study.readme["key"]] = resolve(study.readme["part"])(*source(study, directory))
        elif (directory / "summary.csv").exists():
            out[study.readme["key"]] = resolve(study.readme["part"])(results_mod.load(directory))
        else:
            out[study.readme["key"]] = None
    return out
