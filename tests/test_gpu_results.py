"""The committed GPU measurements (``results/gpu/``) and what the report renders from them.

Table 1's GPU section, README's GPU block and docs/reproducing.md's GPU hours must carry the
committed files' numbers (read here from the JSON, never typed in a test); a GPU's folder says
which revision measured it, and a one-epoch run without its config is refused in one line.
"""

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from petra_core.report import costs as costs_mod
from petra_core.report import gpu, labels, readme, tables

ROOT = Path(__file__).resolve().parents[1]
GPU_DIR = ROOT / "results" / "gpu"
BENCH_FILES = sorted(GPU_DIR.glob("*.json"))


def bench_name(device: str) -> str:
    """The file name ``benchmarks/bench_gpu.py`` gives a GPU (its rule, restated to check the files)."""
    return re.sub(r"[^A-Za-z0-9]+", "-", device).strip("-").lower()


@pytest.fixture(scope="module")
def table1():
    context = tables.table1_context(costs_mod.load(ROOT / "results" / "costs"))
    context = {**context, "gpu": gpu.gpu_context(gpu.load(GPU_DIR))}
    return {fmt: tables.render("table1_costs", fmt, context) for fmt in ("md", "tex")}


def test_the_committed_gpu_files_are_named_for_their_gpu_and_documented():
    assert BENCH_FILES, "results/gpu/ holds no bench_gpu.py file"
    for path in BENCH_FILES:
        record = json.loads(path.read_text())
        assert path.stem == bench_name(record["device"]), path
        folder = path.with_suffix("")
        provenance = json.loads((folder / gpu.PROVENANCE).read_text())
        about = (folder / "README.md").read_text()
        assert f"`{provenance['revision']}`" in about and provenance["date"] in about
        assert record["device"] in about and record["torch"] in about and f"CUDA {record['cuda']}" in about
        for name in sorted(p.name for p in folder.iterdir() if p.name != "README.md"):
            assert f"`{name}`" in about, f"{folder / 'README.md'} does not say what {name} is"


def test_table1_renders_every_committed_gpu_row(table1):
    md, tex = table1["md"], table1["tex"]
    for path in BENCH_FILES:
        record = json.loads(path.read_text())
        assert f"{record['device']} (torch {record['torch']}, CUDA {record['cuda']}" in md
        base = {
            (r["arch"], r["stem"], r["settings"]): r["s_per_batch"]
            for r in record["rows"]
            if r["method"] == "backprop" and r.get("s_per_batch")
        }
        for r in record["rows"]:
            method = labels.METHOD_LABELS[r["method"]]
            cells = f"| {labels.model_label(r['arch'])} | {r['stem']} | {r['settings']} | {method} |"
            if r.get("oom"):
                assert f"{cells} out of memory | – | – | tried {r['tried_bytes'] / 2**30:.2f} |" in md
                continue
            ratio = r["s_per_batch"] / base[(r["arch"], r["stem"], r["settings"])]
            line = (
                f"{cells} {1e3 * r['s_per_batch']:.1f} | {ratio:.2f} | {1e3 * r['host_s_per_tick']:.1f} |"
                f" {r['device_peak_bytes'] / 2**30:.2f} |"
            )
            assert line in md, line
            assert f"{1e3 * r['s_per_batch']:.1f} & {ratio:.2f} & {1e3 * r['host_s_per_tick']:.1f}" in tex
        plain = json.loads((path.with_suffix("") / gpu.PLAIN).read_text())
        for p in plain["plain_vs_engine"]:
            petra = f"{p['petra_over_plain']:.2f}" if "petra_over_plain" in p else "–"
            line = (
                f"| {labels.model_label(p['arch'])} | {p['batch']} | {p['settings']} | {1e3 * p['plain_s']:.1f} |"
                f" {p['backprop_over_plain']:.2f} | {petra} |"
            )
            assert line in md, line
    assert "No GPU has measured" not in md


def test_readme_and_reproducing_render_the_committed_epochs():
    """README's GPU block: images/s of each one-epoch run, PETRA ÷ backprop, the host's share;
    docs/reproducing.md: the hours that rate gives for the paper profile's CIFAR-10 epochs."""
    block = readme.render_gpu(ROOT / "results")
    hours = readme.render_doc_blocks(ROOT / "results", ROOT / "workflow/studies")["gpu-hours"]
    paper = {
        b["method"]: b["epochs"]
        for b in yaml.safe_load((ROOT / "workflow/config/profiles/paper.yaml").read_text())["grid"]
        if b["dataset"] == "cifar10"
    }
    for path in BENCH_FILES:
        folder = path.with_suffix("")
        record = json.loads(path.read_text())
        provenance = json.loads((folder / gpu.PROVENANCE).read_text())
        for text in (block, hours):
            assert record["device"] in text and f"`{provenance['revision']}`" in text
        for run in sorted(folder.glob(gpu.EPOCH_RUNS)):
            m, c = json.loads(run.read_text()), provenance["runs"][run.name]
            assert f"{labels.METHOD_LABELS[c['method']]} {m['images_per_s']:,.0f} images/s" in block
            h = paper[c["method"]] * m["optimizer_steps"] * c["batch_size"] * c["k"] / m["epochs"]
            h /= m["images_per_s"] * 3600
            assert f"| {m['images_per_s']:,.0f} | {paper[c['method']]} | {h:.1f} h |" in hours
        ratio = next(
            r["petra_over_backprop_step"]
            for r in record["ratios"]
            if (r["arch"], r["stem"], r["settings"]) == ("revnet18", "cifar", "training")
        )
        assert f"RevNet18 cifar stem {ratio:.2f} / " in block
        petra = next(
            r
            for r in record["rows"]
            if (r["arch"], r["stem"], r["settings"], r["method"]) == ("revnet18", "cifar", "training", "petra")
        )
        assert f"tick in {1e3 * petra['host_s_per_tick']:.1f} / " in block
        assert f"against {1e3 * petra['s_per_batch']:.1f} / " in block


def test_without_gpu_records_the_blocks_say_so(tmp_path):
    assert "No GPU has trained a real epoch" in readme.render_gpu(tmp_path)
    assert gpu.summary(tmp_path / "gpu") == []


def test_a_one_epoch_run_without_its_config_is_refused(tmp_path):
    shutil.copy(BENCH_FILES[0], tmp_path / BENCH_FILES[0].name)
    folder = tmp_path / BENCH_FILES[0].stem
    shutil.copytree(BENCH_FILES[0].with_suffix(""), folder)
    provenance = json.loads((folder / gpu.PROVENANCE).read_text())
    dropped = sorted(provenance["runs"])[0]
    del provenance["runs"][dropped]
    (folder / gpu.PROVENANCE).write_text(json.dumps(provenance))
    with pytest.raises(ValueError, match=rf"^{re.escape(dropped)}: no config in provenance.json"):
        gpu.summary(tmp_path)


def test_rows_of_several_batches_and_phases_compare_with_backprop_of_their_own():
    """bench_gpu.py's rows carry a batch and phases: each time is set against backprop's at the same
    model, settings, batch and phases, and the plain loop's row is named as such."""
    from petra_core.report import gpu

    def row(method, batch, ms, phases="eager"):
        return dict(
            arch="revnet18",
            stem="cifar",
            settings="bf16",
            method=method,
            batch=batch,
            phases=phases,
            s_per_batch=ms / 1e3,
            host_s_per_tick=ms / 2e3,
            device_peak_bytes=2**30,
        )

    measured = [
        row("plain", 64, 2.0),
        row("backprop", 64, 4.0),
        row("petra", 64, 6.0),
        row("backprop", 256, 10.0),
        row("petra", 256, 12.0),
        row("petra", 64, 5.0, "graphs"),
    ]
    rows = gpu._rows(measured, 64)
    ratio = {(r["method"], r["settings"]): r["ratio"] for r in rows}
    assert ratio["PETRA", "bf16"] == pytest.approx(1.5)
    assert ratio["PETRA", "bf16, batch 256"] == pytest.approx(1.2)
    assert ratio["PETRA (graphs phases)", "bf16"] is None  # no backprop measured with graphs
    assert ratio[gpu.PLAIN_LABEL, "bf16"] == pytest.approx(0.5)
