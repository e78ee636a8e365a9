"""The study registry (workflow/studies/*.yaml): every study declared once, and a new one picked up by
the report, dvc.yaml and the Snakemake rules from its declaration and templates alone."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from petra_core.report import studies as report_studies
from petra_core.report import tables
from petra_core.report.commands import study_dirs
from petra_core.run import runio
from petra_core.workflow import dvc_stages, studies

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "workflow/studies"
BIN = Path(sys.executable).parent

TOY = {
    "study": "toy",
    "about": "a toy study: one measured table",
    "measure": {"command": "printf 'method,top1\\npetra,71.5\\n' | tee {out}/toy.csv"},
    "records": ["toy.csv"],
    "templates": "toy_templates",
    "tables": {
        "toy": {"context": "petra_core.report.studies:rows_context", "table": "toy", "columns": ["method", "top1"]}
    },
}
TOY_TEMPLATES = {
    "toy.md.j2": "{% for r in rows %}| {{ r.method }} | {{ '%.2f' | format(r.top1) }} |\n"
    "{% else %}not measured yet\n{% endfor %}",
    "toy.tex.j2": "{% for r in rows %}{{ r.method }} & {{ '%.2f' | format(r.top1) }} \\\\\n{% endfor %}",
}


@pytest.fixture
def registry(tmp_path) -> Path:
    """The committed registry plus the toy study: one declaration, its templates, nothing else."""
    registry = tmp_path / "studies"
    shutil.copytree(REGISTRY, registry)
    (registry / "toy.yaml").write_text(yaml.safe_dump(TOY, sort_keys=False))
    (registry / "toy_templates").mkdir()
    for name, text in TOY_TEMPLATES.items():
        (registry / "toy_templates" / name).write_text(text)
    return registry


def test_every_study_is_declared_once_and_its_builders_and_templates_exist():
    declared = studies.load_all(REGISTRY)
    assert {s.name for s in declared} == {
        "acco",
        "budget",
        "cdp",
        "cpu",
        "cyclic",
        "plan",
        "transformers",
        "wash",
        "acco-lm",
    }
    for study in declared:
        if study.profile:
            assert (ROOT / "workflow/config/profiles" / f"{study.profile}.yaml").exists(), study.name
        for entry in [*study.tables.values(), *study.figures.values()]:
            assert callable(report_studies.resolve(entry.get("context") or entry["draw"]))
        for name in study.tables:
            for fmt in tables.FORMATS:
                assert (tables.TEMPLATES / f"{name}.{fmt}.j2").exists(), f"{study.name}: {name}.{fmt}.j2"
        if study.readme:
            assert callable(report_studies.resolve(study.readme["part"]))
    cyclic = next(s for s in declared if s.name == "cyclic")
    assert cyclic.records == runio.CYCLIC_FILES, "the cyclic study reads what petra cyclic writes"


def test_dvc_yaml_is_what_the_registry_gives():
    """dvc.yaml is generated (workflow/scripts/dvc_yaml.py); a study added without regenerating it fails here."""
    from petra_core.report.figures import FIGURES

    assert (ROOT / "dvc.yaml").read_text() == dvc_stages.render(studies.load_all(REGISTRY)), (
        "dvc.yaml is stale: run python workflow/scripts/dvc_yaml.py"
    )
    assert dvc_stages.PLOTS == FIGURES


@pytest.mark.parametrize(
    "declaration, error",
    [
        ({"study": "other", "profile": "cdp"}, "declares study 'other'; expected 'bad'"),
        ({"study": "bad"}, "either `profile`"),
        ({"study": "bad", "profile": "cdp", "measure": {"command": "x"}}, "either `profile`"),
        ({"study": "bad", "measure": {"command": "x"}}, "lists the `records`"),
        ({"study": "bad", "profile": "cdp", "tables": {"t": "no_colon"}}, "tables.t needs context: module:function"),
        ({"study": "bad", "profile": "cdp", "figure": {}}, "unknown keys ['figure']"),
        ({"study": "bad", "profile": "cdp", "readme": {"key": "x"}}, "readme needs exactly `key` and `part`"),
    ],
)
def test_a_bad_declaration_is_one_clear_line(tmp_path, declaration, error):
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(declaration))
    with pytest.raises(ValueError, match=re.escape(error)):
        studies.load_all(tmp_path)


def test_two_studies_may_not_write_one_table(registry):
    (registry / "again.yaml").write_text(
        yaml.safe_dump(
            {"study": "again", "profile": "cdp", "tables": {"toy": "petra_core.report.studies:rows_context"}}
        )
    )
    with pytest.raises(ValueError, match="table 'toy' is declared by studies 'again' and 'toy'"):
        studies.load_all(registry)


def test_a_study_override_is_name_equals_directory():
    assert study_dirs(["cdp=results/x", "toy=/tmp/t"]) == {"cdp": "results/x", "toy": "/tmp/t"}
    with pytest.raises(ValueError, match="expected NAME=DIR"):
        study_dirs(["results/cdp"])


def test_a_new_study_is_rendered_from_its_declaration_alone(registry, tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    out = tmp_path / "tables"
    tables.render_all(ROOT / "results/budget", ROOT / "results/costs", out, "budget", studies_dir=registry)
    assert (out / "toy.md").read_text() == "not measured yet\n", "no records yet: the table says so"
    (records / "toy.csv").write_text("method,top1\npetra,71.5\nbackprop,72.25\n")
    paths = tables.render_all(
        ROOT / "results/budget",
        ROOT / "results/costs",
        out,
        "budget",
        studies_dir=registry,
        study_dirs={"toy": records},
    )
    assert {p.name for p in paths} >= {"toy.md", "toy.tex", "replica_rules.md", "table2_accuracy.md"}
    assert (out / "toy.md").read_text() == "| petra | 71.50 |\n| backprop | 72.25 |\n"
    assert (out / "toy.tex").read_text() == "petra & 71.50 \\\\\nbackprop & 72.25 \\\\\n"
    for name in ("replica_rules", "populations", "acco", "cyclic", "table2_accuracy"):  # the others unchanged
        assert (out / f"{name}.md").read_bytes() == (ROOT / "paper_tables" / f"{name}.md").read_bytes(), name


def test_a_new_study_gets_its_dvc_stage_and_render_dependency(registry):
    pipeline = dvc_stages.pipeline(studies.load_all(registry), str(registry))
    assert pipeline["stages"]["toy"] == {
        "desc": TOY["about"],
        "cmd": "snakemake --cores 1 --forcerun toy -- results/toy/toy.csv",
        "outs": [{"results/toy": {"cache": False, "persist": True}}],
    }
    deps = pipeline["stages"]["render"]["deps"]
    assert {"results/toy", str(registry), str(registry / "toy_templates")} <= set(deps)
    assert list(pipeline["stages"]) == ["costs", "cyclic", "plan", "toy", "results", "render"]


@pytest.mark.slow  # Snakemake parses the workflow in a subprocess (a few seconds each)
def test_a_new_study_gets_its_snakemake_rule_and_feeds_the_tables(registry):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}

    def dry_run(*targets):
        args = [BIN / "snakemake", "-n", "-p", "--cores", "1", "--config", f"studies_dir={registry}", "--", *targets]
        proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout + proc.stderr

    planned = dry_run("results/toy/toy.csv")
    assert re.search(r"^rule toy:", planned, re.M) and "tee results/toy/toy.csv" in planned
    planned = dry_run("paper_tables")
    assert re.search(r"^rule toy:", planned, re.M), "the tables rule asks for the toy study's records"
    assert f"--studies {registry}" in planned


def test_petra_studies_lists_the_registry(registry, capsys):
    from petra_core.cli import main

    assert main(["studies", "--studies", str(registry)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "acco-lm",
        "acco",
        "budget",
        "cdp",
        "cpu",
        "cyclic",
        "plan",
        "toy",
        "transformers",
        "wash",
    ]
    toy = next(line for line in lines if line.startswith("toy:"))
    assert "results/toy (measured by `printf" in toy and toy.endswith("; table toy")
    assert main(["studies", "--studies", str(registry / "nothing")]) == 2
    assert "is not a directory of study declarations" in capsys.readouterr().err


def test_a_study_may_not_take_a_paper_tables_name(registry, tmp_path):
    (registry / "toy_templates" / "table2_accuracy.md.j2").write_text("")
    declaration = {**TOY, "tables": {"table2_accuracy": TOY["tables"]["toy"]}}
    (registry / "toy.yaml").write_text(yaml.safe_dump(declaration, sort_keys=False))
    with pytest.raises(ValueError, match="study 'toy' declares table 'table2_accuracy', one of the paper's"):
        tables.render_all(
            ROOT / "results/budget", ROOT / "results/costs", tmp_path / "t", "budget", studies_dir=registry
        )
