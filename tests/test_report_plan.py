"""The ``plan`` study (``workflow/studies/plan.yaml``): the planner's answers rendered as a table and a
figure from ``results/plan/answers/answers.json``, and that record is what the planner computes today."""

import json
from pathlib import Path

import pytest

from petra_core.report import plan, tables
from petra_core.workflow import studies

ROOT = Path(__file__).resolve().parents[1]
GIB, MIB = 2**30, 2**20
PROVENANCE = {
    "profile": "results/gpu/nvidia-h200/stage_profile.json",
    "settings": "training",
    "clusters": ["8x1-100gbe"],
    "revision": "abc1234",
    "cards": {"8x1-100gbe": {"card": "petra_core/plan/clusters/8x1-100gbe.yaml", "source": "datasheet"}},
    "pipedream": {"formula": "(J - j)(A_j + W_j)", "source": "msr-fiddle/pipedream"},
    "epoch": "steady state",
}


def _row(method, layout, devices, replicas, seconds, speedup, peak, fits=True):
    return dict(arch="revnet18", stem="cifar", cluster="8x1-100gbe", method=method, k=1, layout=layout,
                devices=devices, replicas=replicas, split="0-9", batch=64, seconds_per_minibatch=seconds / 782,
                seconds_per_epoch=seconds, samples_per_s=1.0 / seconds, speedup=speedup, bubble_fraction=0.25,
                peak_bytes=peak, memory_bytes=80 * GIB, fits=fits,
                profile=f"results/gpu/nvidia-h200/stage_profile.json (training, phases of {method})")  # fmt: skip


def _formula(method, stage, kept, weights, paper_act, paper_params, pipedream, planner):
    return dict(arch="revnet18", stem="cifar", width=64, batch=64, k=1, method=method, J=2, stage=stage,
                input_bytes=MIB, graph_bytes=kept, weight_bytes=weights, kept_bytes=kept, stash_copies=2 - stage,
                activations_expr="2*(J-j)*FG" if method == "delayed" else "0",
                params_expr="2*(J-j)/k" if method == "delayed" else "1", activations_bytes=paper_act,
                params_bytes=paper_params, pipedream_bytes=pipedream, planner_bytes=planner)  # fmt: skip


@pytest.fixture
def record() -> dict:
    """Two methods of RevNet18 on one card: PETRA with phase times, delayed without (left out)."""
    return {
        "rows": [
            _row("petra", "best", 1, 1, 30.0, 1.0, 2 * GIB),
            _row("petra", "best", 2, 2, 15.5, 1.94, 2 * GIB),
            _row("petra", "pipeline", 1, 1, 30.0, 1.0, 2 * GIB),
            _row("petra", "pipeline", 2, 1, 20.0, 1.5, GIB, fits=False),
        ],
        "fewest": [
            dict(
                arch="revnet18",
                cluster="8x1-100gbe",
                method="petra",
                batch=256,
                microbatch=256,
                k=1,
                devices=1,
                why=None,
            ),
            dict(
                arch="revnet18",
                cluster="8x1-100gbe",
                method="delayed",
                batch=256,
                microbatch=256,
                k=1,
                devices=None,
                why="no split fits",
            ),
        ],  # fmt: skip
        "largest": [
            dict(
                stem="cifar",
                cluster="8x1-100gbe",
                method="petra",
                batch=64,
                arch="revnet34",
                width=2048,
                params=21_769_424_906,
                devices=8,
                peak_bytes=70 * GIB,
                split="0-17",
            ),
            dict(stem="cifar", cluster="8x1-100gbe", method="delayed", batch=64),
        ],  # fmt: skip
        "formulas": [
            _formula("delayed", 1, 10 * MIB, MIB, 20 * MIB, 2 * MIB, 11 * MIB, 40 * MIB),
            _formula("delayed", 2, 0, MIB, 0, 0, 0, 3 * MIB),
            _formula("petra", 1, 0, MIB, 0, MIB, None, 5 * MIB),
            _formula("petra", 2, 0, MIB, 0, MIB, None, 3 * MIB),
        ],
        "missing": [{"arch": "revnet18", "method": "delayed", "why": "no training row in the profile"}],
        "provenance": PROVENANCE,
    }


def test_the_context_has_a_row_per_model_cluster_and_method(record):
    c = plan.plan_context(record)
    assert c["applies"] and [r["method"] for r in c["rows"]] == ["Delayed (weight stash)", "PETRA"]
    delayed, petra = c["rows"]
    assert not delayed["profiled"] and delayed["epoch_one"] is None and delayed["fewest"] == "none fits"
    assert delayed["largest"] == "–"  # nothing found: said, not invented
    assert petra["epoch_one"] == 30.0 and (petra["layout"], petra["epoch_best"], petra["speedup_best"]) == (
        "1×2",
        15.5,
        1.94,
    )
    assert (petra["pipeline_devices"], petra["speedup_pipeline"], petra["memory_gib"], petra["fits"]) == (
        2,
        1.5,
        1.0,
        False,
    )
    assert petra["phases"] == "petra" and petra["fewest"] == "1" and petra["largest"].startswith("RevNet34 width 2048")
    assert c["provenance"]["revision"] == "abc1234" and c["batch_for_min"] == 256 and c["shape"]["width"] == 64


def test_the_formulas_are_the_records_bytes_per_stage_and_summed(record):
    c = plan.plan_context(record)
    first = c["stages"][0]
    assert [s["stage"] for s in c["stages"]] == [1, 2]  # delayed only: PipeDream's method
    assert (first["in_flight_paper"], first["in_flight_pipedream"], first["stash_copies"]) == (2, 1, 1)
    assert (first["activation_mib"], first["pipedream_mib"], first["paper_mib"], first["planner_mib"]) == (
        10,
        11,
        22,
        40,
    )
    terms = {t["method"]: t for t in c["terms"]}
    assert terms["PETRA"]["planner_gib"] == pytest.approx(8 / 1024) and terms["PETRA"]["activations"] == "0"
    assert terms["Delayed (weight stash)"]["paper_activation_gib"] == pytest.approx(20 / 1024)


def test_the_table_renders_the_rows_provenance_and_formulas(record):
    c = plan.plan_context(record)
    md = tables.render("plan", "md", c)
    assert (
        "| RevNet18 | 8x1-100gbe | PETRA | petra | 30.0 | 1×2 | 15.5 | 1.94 | 2 | 20.0 | 1.50 | 25.0 | 1.00 ✗ | 1 |"
        in md
    )
    assert "code revision `abc1234`" in md and "`petra_core/plan/clusters/8x1-100gbe.yaml`): datasheet" in md
    assert "Left out (revnet18, delayed): no training row in the profile." in md
    assert "| RevNet18 | 1 / 2 | 2 | 1 | 1 | 10.0 | 1.00 | 11.0 | 22.0 | 40.0 |" in md
    assert "| RevNet18 | Delayed (weight stash) | 2(J−j)·FG | 2(J−j)/k |" in md
    assert "\\begin{tabular}" in tables.render("plan", "tex", c)
    empty = plan.plan_context(None)
    assert "Not computed" in tables.render("plan", "md", empty) and "not computed" in tables.render(
        "plan", "tex", empty
    )


def test_the_figure_renders_to_a_png(record, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    fig = plan.plan_figure(record)
    assert len(fig.axes) == 1  # one model x one card
    fig.savefig(tmp_path / "plan.png")
    assert (tmp_path / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plan.plan_figure(None).axes[0].texts  # nothing computed: says so


def test_load_reads_the_record_or_nothing(record, tmp_path):
    assert plan.load(tmp_path) is None and plan.load(None) is None
    (tmp_path / "answers.json").write_text(json.dumps(record))
    assert plan.load(tmp_path) == record


def test_the_committed_answers_are_what_the_planner_computes_now(tmp_path, monkeypatch):
    """Every number of results/plan/answers (computed, not timed), the revision that computed it
    apart (5-15 s on the shared 2-core box, so not marked slow). If this fails: ``dvc repro plan``
    (or ``petra plan answers --out results/plan/answers/answers.json``)."""
    import shlex

    from petra_core.cli import main

    monkeypatch.chdir(ROOT)  # the declared command runs at the repository root
    study = next(s for s in studies.load_all(ROOT / "workflow/studies") if s.name == "plan")
    argv = shlex.split(study.command.format(out=tmp_path))  # the declared command, into tmp_path
    assert argv[0] == "petra" and main(argv[1:]) == 0
    measured = json.loads((tmp_path / "answers.json").read_text())
    committed = json.loads((ROOT / study.results / "answers.json").read_text())
    for record in (committed, measured):
        record["provenance"].pop("revision")
    assert measured == committed
