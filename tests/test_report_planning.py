"""docs/planning.md's generated block: the planner against the emulated runs, from the validate record."""

import json
import shutil
from pathlib import Path

from petra_core.report import readme

ROOT = Path(__file__).resolve().parents[1]

ROW = dict(method="petra", stages=4, replicas=1, k=1, emulated=True, link=[5e-4, 1e7], predicted_s=0.1063,
           measured_s=0.108, error=0.1063 / 0.108 - 1, device_only_error=-0.05, padded_over=1)  # fmt: skip
RECORD = dict(
    rows=[ROW, {**ROW, "method": "backprop", "stages": 3, "emulated": False, "link": None, "padded_over": None}],
    summary=dict(
        emulated=dict(
            points=1,
            mean_abs_error=0.0157,
            max_abs_error=0.0157,
            device_only_mean_abs_error=0.05,
            device_only_max_abs_error=0.05,
        ),
        real=dict(points=1, mean_abs_error=0.0157, max_abs_error=0.0157),
    ),  # fmt: skip
    settings=dict(minibatches=40, width=4, batch=8, real=dict(width=32, batch=64, minibatches=200)),
    provenance=dict(revision="abc1234", date="2026-12-05T09:00:00Z", load_average=[3.25, 3.0, 2.5], cpus=2),
)


def test_the_block_renders_every_point_and_the_summary(tmp_path):
    (tmp_path / "plan").mkdir()
    (tmp_path / "plan" / "validate.json").write_text(json.dumps(RECORD))
    [(begin, end, block), _] = readme.render_planning_blocks(tmp_path)
    assert block.startswith(begin) and block.endswith(end)
    assert "**1 emulated points**, mean |error| 1.6 %" in block and "**1 real gloo runs**" in block
    assert "| petra | 4 | 1 | 1 | 10 MB/s | 106.3 | 108.0 | -1.6 % | -5.0 % |" in block
    assert "200 a real one (width 32, batch 64)" in block and "emulated mean\n5.0 %" in block
    assert "| backprop | 3 | 1 | 1 | real (gloo) |" in block and "overran their emulated target: 1" in block
    assert "`abc1234`" in block and "load average\n3.2" in block or "load average 3.2" in block.replace("\n", " ")


def test_readme_check_fails_on_a_changed_number_in_planning_md(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("reproducing.md", "planning.md"):
        shutil.copy(ROOT / "docs" / name, docs / name)
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    results = ROOT / "results"
    args = dict(results_root=results, doc=docs / "reproducing.md")
    assert readme.stale(tmp_path / "README.md", **args) == []
    text = (docs / "planning.md").read_text()
    begin, end = readme.doc_markers("plan-validate")
    head, rest = text.split(begin, 1)
    (docs / "planning.md").write_text(head + begin + "\nmean |error| 0.1 %\n" + end + rest.split(end, 1)[1])
    assert readme.stale(tmp_path / "README.md", **args) == [str(docs / "planning.md")]


def test_the_gpu_check_is_the_planners_prediction_beside_the_bench_row():
    """The committed H200 stage profile predicted on one device against the bench row of the same
    model and method: the rendered block holds what ``petra plan predict`` prints."""
    from petra_core.plan.profiling import from_stage_profile
    from petra_core.plan.simulate import predict
    from petra_core.report.plan_gpu_check import check_rows

    rows = check_rows(ROOT / "results/gpu")
    backprop = next(r for r in rows if (r["gpu"], r["model"], r["method"]) == ("nvidia-h200", "RevNet18", "Backprop"))
    profile = from_stage_profile(
        ROOT / "results/gpu/nvidia-h200/stage_profile.json", arch="revnet18", method="backprop", settings="training"
    )
    assert backprop["predicted_ms"] == 1e3 * predict(profile, "backprop", placement=[range(10)]).seconds_per_minibatch
    bench = json.loads((ROOT / "results/gpu/nvidia-h200.json").read_text())["rows"]
    row = next(r for r in bench if (r["arch"], r["method"], r["settings"]) == ("revnet18", "backprop", "training"))
    assert backprop["bench_ms"] == 1e3 * row["s_per_batch"]
    assert {r["model"] for r in rows} == {"RevNet18", "RevNet50"}  # RevNet50 delayed ran out of memory: no row
    [_, (begin, end, block)] = readme.render_planning_blocks(ROOT / "results")
    assert (
        f"| nvidia-h200 | RevNet18 | Backprop | {backprop['predicted_ms']:.1f} ms | {backprop['bench_ms']:.1f} ms |"
        in block
    )
