"""The report layer: aggregation of run directories, the paper's reference file, Jinja2 tables.

Fast: fake run directories in tmp_path, cost tables measured at tiny shapes.
"""

import json
import math
import sys
from pathlib import Path

import jinja2
import pandas as pd
import pytest
import yaml

from petra_core.accounting import costs as measured_costs
from petra_core.reference import load_paper_reference, load_reference
from petra_core.report import costs, results, tables
from petra_core.report.labels import formula, pm, pretty_expr, tex
from petra_core.run.config import RunConfig
from petra_core.workflow import grid
from petra_core.workflow.studies import load_all

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "workflow" / "config" / "profiles"

# --- fake runs ---------------------------------------------------------------------------------
FAKE_PROFILE = {
    "profile": "fake",
    "train": {
        "dataset": "cifar10",
        "data_source": "nowhere.tar.gz",
        "width": 8,
        "epochs": 3,
        "batch_size": 32,
        "fidelity_every": 2,
    },
    "grid": [
        {"arch": ["revnet18"], "method": ["backprop"], "k": [1], "seed": [0, 1]},
        {"arch": ["revnet18"], "method": ["petra"], "k": [1, 2], "seed": [0]},
    ],
}
TOP1 = {("backprop", 1, 0): 71.25, ("backprop", 1, 1): 72.75, ("petra", 1, 0): 60.5, ("petra", 2, 0): 58.0}
TRAIN_ACC = {("petra", 1, 0): 61.0, ("petra", 2, 0): 65.0}  # k = 2 has the better training accuracy


def write_records(run_dir: Path, cfg: dict, metrics: dict, history: list[dict]) -> None:
    """A finished run's records as petra train writes them (config.yaml, metrics.json, history.json)."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(RunConfig.from_dict(cfg).to_dict()))
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    (run_dir / "history.json").write_text(json.dumps(history))


def profile_results(tmp_path_factory, spec: dict, write_run_of) -> dict:
    """Fake records of every run of the profile ``spec`` (``write_run_of(run_dir, config)``), gathered
    as ``petra results`` does and read back."""
    root = tmp_path_factory.mktemp(spec["profile"])
    path = root / f"{spec['profile']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    for run in grid.runs(spec):
        write_run_of(root / run.directory, run.config.to_dict())
    out = root / "results" / spec["profile"]
    results.write(results.collect(path, root=root), out)
    return results.load(out)


def write_run(run_dir: Path, cfg: dict, fidelity: bool) -> None:
    key = (cfg["method"], cfg["k"], cfg["seed"])
    top1 = TOP1[key]
    history = [
        {
            "epoch": e,
            "train_loss": 2.0 / e,
            "train_acc": 20.0 * e,
            "test_loss": 1.5 / e,
            "top1": top1 - 10 * (3 - e),
            "top5": 90.0,
            "lr": 0.1,
            "images_per_s": 100.0,
            "wall_time_s": 10.0,
            "eval_time_s": 1.0,
        }
        for e in (1, 2, 3)
    ]
    metrics = {
        "top1": top1,
        "top5": 90.0,
        "test_loss": 0.5,
        "train_loss": 0.7,
        "train_acc": TRAIN_ACC.get(key, 70.0),
        "best_top1": top1,
        "top1_last10_mean": sum(h["top1"] for h in history) / 3,
        "epochs": 3,
        "optimizer_steps": 30,
        "peak_kept_bytes": [1_000_000 * (j % 3) for j in range(10)],
        "images_per_s": 100.0,
        "wall_time_s": 33.0,
        "params": 177_274,
        "stages": 10,
        "stage_kinds": "S R R D R D R D R H",
    }
    write_records(run_dir, cfg, metrics, history)
    (run_dir / "env.json").write_text(
        json.dumps({"device": "cpu", "processor": "test-cpu", "torch_threads": 1, "torch": "x", "git_revision": "abc"})
    )
    if fidelity:
        rows = [
            {
                "method": cfg["method"],
                "step": s,
                "tick": s,
                "stage": j,
                "kind": "R",
                "num_minibatches": 1,
                "cosine": 0.9,
                "rel_error": 0.1,
                "grad_norm": 1.0,
                "true_norm": 1.0,
            }
            for s in (0, 2)
            for j in range(3)
        ]
        pd.DataFrame(rows).to_csv(run_dir / "fidelity.csv", index=False)


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    profile_path = root / "fake.yaml"
    profile_path.write_text(yaml.safe_dump(FAKE_PROFILE))
    for run in grid.runs(FAKE_PROFILE):
        cfg = {**FAKE_PROFILE["train"], **run.point}
        write_run(root / run.directory, cfg, fidelity=run.point["method"] == "petra")
    frames = results.collect(profile_path, root=root)
    out = root / "results" / "fake"
    results.write(frames, out)
    return {"root": root, "profile": profile_path, "frames": frames, "results_dir": out}


@pytest.fixture(scope="module")
def cost_tables(tmp_path_factory):
    out = tmp_path_factory.mktemp("costs")
    tiny = {
        "table1": {"stem": "cifar", "image_size": 16, "width": 4, "num_classes": 10},
        "fidelity": {"width": 4, "image_size": 8, "batch": 4, "num_batches": 12, "every": 2},
    }
    measured_costs.write(measured_costs.measure(tiny), out)
    return out


# --- reference file -----------------------------------------------------------------------------
def test_reference_file_loads_and_is_the_one_accounting_reads():
    ref = load_paper_reference()
    assert ref["table3"]["rows"][3]["memory_gb"] == 20.3
    assert load_reference("paper_table3") == ref["table3"]
    assert load_reference("paper_table1") == ref["table1"]
    assert load_reference("table1")["methods"]["petra"]["time"] == "3"
    petra18 = next(r for r in ref["table2"]["rows"] if (r["method"], r["arch"]) == ("petra", "revnet18"))
    assert (petra18["cifar10"], petra18["imagenet32"], petra18["imagenet"]) == (94.9, 54.6, 71.0)
    assert not list((ROOT / "petra_core" / "accounting").glob("paper_table*.yaml")), "numbers live in one file"
    with pytest.raises(KeyError):
        load_reference("paper_table9")


def test_paper_profile_encodes_the_papers_recipe():
    recipe = load_paper_reference()["recipe"]
    spec = grid.load_profile(PROFILES / "paper.yaml")
    runs = [r.config for r in grid.runs(spec)]
    assert {c.device for c in runs} == {"cuda"} and {c.width for c in runs} == {64}
    for c in runs:
        want = recipe[c.dataset]
        assert (c.epochs, c.milestones, c.weight_decay) == (want["epochs"], want["milestones"], want["weight_decay"])
        assert c.batch_size == want["batch_petra" if c.method == "petra" else "batch_backprop"]
        assert c.warmup_epochs == recipe["optimizer"]["warmup_epochs"] and c.base_lr == recipe["optimizer"]["base_lr"]
    ks = {c.k for c in runs if c.method == "petra"}
    assert ks == set(load_paper_reference()["table2"]["k_choices"])
    assert {c.seed for c in runs if c.dataset == "cifar10"} == {0, 1, 2}


def test_smoke_profile_covers_every_kind_of_run():
    spec = grid.load_profile(PROFILES / "smoke.yaml")
    points = [r.point for r in grid.runs(spec)]
    assert spec["train"]["dataset"] == "synthetic" and spec["train"]["threads"] == 1
    assert spec["train"]["progress"] is False and spec["train"]["width"] <= 8
    assert {(p["arch"], p["method"]) for p in points} >= {
        ("resnet18", "backprop"),
        ("revnet18", "backprop"),
        ("revnet18", "delayed"),
        ("revnet18", "dsp"),
        ("revnet18", "petra"),
    }
    assert {p["k"] for p in points if p["method"] == "petra"} == {1, 2}
    assert any(sum(q == {**p, "seed": q["seed"]} for q in points) >= 2 for p in points), "two seeds for one run"


def test_dvc_params_are_generated_from_the_default_profile(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / "workflow" / "scripts"))
    import dvc_params

    assert dvc_params.main(["--check"]) == 0, "params.yaml is stale: python workflow/scripts/dvc_params.py"
    data = dvc_params.params("smoke")
    smoke = grid.load_profile(PROFILES / "smoke.yaml")
    assert data == {
        "profile": "smoke",
        "profile_file": "workflow/config/profiles/smoke.yaml",
        "train": {k: v for k, v in smoke["train"].items() if k not in grid.WATCH_KEYS},
    }
    sys.modules.pop("dvc_params", None)


# --- aggregation --------------------------------------------------------------------------------
def test_results_table_has_one_row_per_run_with_config_and_metrics(fake):
    r = fake["frames"]["results"]
    assert len(r) == 4 and set(r.method) == {"backprop", "petra"}
    row = r[(r.method == "petra") & (r.k == 2)].iloc[0]
    assert row.top1 == 58.0 and row.cfg_batch_size == 32 and row.cfg_fidelity_every == 2 and row.env_device == "cpu"
    assert row.run_dir == "runs/fake/cifar10/revnet18-w8/petra-k2-seed0"
    assert row.params > 0 and row.num_stages == 10 and math.isclose(row.kept_total_mb, 9.0)
    assert len(fake["frames"]["history"]) == 4 * 3
    assert len(fake["frames"]["memory"]) == 4 * 10 and set(fake["frames"]["memory"].kind) == set("SRDH")
    fid = fake["frames"]["fidelity"]
    assert len(fid) == 2 * 6 and set(fid.method) == {"petra"}


def test_summary_is_mean_std_n_over_seeds(fake):
    s = results.summarize(fake["frames"]["results"])
    bp = s[s.method == "backprop"].iloc[0]
    assert bp.n == 2 and bp.top1_mean == 72.0 and math.isclose(bp.top1_std, pd.Series([71.25, 72.75]).std())
    assert s[s.method == "petra"].n.tolist() == [1, 1] and s[s.method == "petra"].top1_std.isna().all()
    assert results.metrics_files(s)["cifar10-revnet18-w8-backprop-k1"] == {
        "top1_mean": 72.0,
        "n": 2,
        "top1_std": round(bp.top1_std, 4),
    }
    assert all("top1_std" not in m for name, m in results.metrics_files(s).items() if "petra" in name)  # n = 1


def test_a_key_only_some_runs_set_keeps_every_run_in_the_summary(fake):
    """The cpu profile sets aux_head for its local-learning block only: the other runs' NaN must
    not drop them from the summary (pandas' groupby drops NaN keys by default)."""
    r = fake["frames"]["results"].copy()
    r.insert(r.columns.get_loc("run"), "aux_head", [None] * (len(r) - 1) + ["cnn"])
    s = results.summarize(r)
    assert int(s.n.sum()) == len(r) and s.aux_head.isna().sum() == len(s) - 1, s[["method", "k", "aux_head", "n"]]


def test_a_batch_size_the_profile_varies_is_the_summarys_own(fake):
    """A profile whose rows set batch_size has it in the identity (no cfg_batch_size column): the
    transformers profile, text at 12 and images at 64."""
    r = fake["frames"]["results"].copy()
    batch = r.pop("cfg_batch_size")
    r.insert(r.columns.get_loc("run"), "batch_size", [int(b) * 2 for b in batch])
    s = results.summarize(r)
    assert sorted(set(s.batch_size)) == sorted({int(b) * 2 for b in batch}) and int(s.n.sum()) == len(r)
    from petra_core.report.labels import describe_runs

    assert f"batch {int(batch.iloc[0]) * 2}" in describe_runs(r)


def test_a_width_in_a_column_with_missing_widths_names_its_metrics_file_as_an_integer():
    assert (
        results._width_part(64.0) == "-w64"
        and results._width_part(float("nan")) == ""
        and results._width_part(None) == ""
    )


def test_results_written_and_read_back(fake):
    back = results.load(fake["results_dir"])
    assert set(back) == {"results", "history", "memory", "fidelity", "summary", "delays"}
    assert back["delays"].empty  # a study's own table, absent here
    assert len(back["results"]) == 4 and len(back["summary"]) == 3
    metrics = sorted((fake["results_dir"] / "metrics").glob("*.json"))  # DVC's: a file (a row) per group
    assert len(metrics) == len(back["summary"]) and set(json.loads(metrics[0].read_text())) <= {
        "top1_mean",
        "top1_std",
        "n",
    }


def test_dvc_metrics_are_a_row_per_group_named_by_what_tells_groups_apart():
    """`dvc metrics show` prints a row per file: each group of runs gets a short file name, with only
    the varied keys that tell groups apart (a name such as the optimizer before a number)."""
    summary = pd.DataFrame(
        {
            "profile": "p",
            "dataset": "cifar10",
            "arch": "resnet18",
            "width": 8,
            "method": "backprop",
            "k": 2,
            "base_lr": [0.1, 0.1, 0.002, 0.002],
            "optimizer": ["sgd", "sgd", "adamw", "adamw"],
            "epochs": 40,
            "replica_rule": ["dpu", "acco", "dpu", "acco"],
            "rule_options": ['{"warmup": 0}', "{}", '{"warmup": 0}', "{}"],
            "n": [2, 1, 2, 2],
            "top1_mean": [70.0, 71.0, 72.0, 73.0],
            "top1_std": [0.5, float("nan"), 0.25, 0.125],
        }
    )
    assert results.group_names(summary) == [
        "cifar10-resnet18-w8-backprop-k2-optimizer=sgd-replica_rule=dpu",
        "cifar10-resnet18-w8-backprop-k2-optimizer=sgd-replica_rule=acco",
        "cifar10-resnet18-w8-backprop-k2-optimizer=adamw-replica_rule=dpu",
        "cifar10-resnet18-w8-backprop-k2-optimizer=adamw-replica_rule=acco",
    ]
    twins = pd.concat([summary.iloc[:1], summary.iloc[:1]], ignore_index=True)
    with pytest.raises(ValueError, match="no key tells apart"):
        results.group_names(twins)


def test_missing_runs_are_an_error_unless_allowed(fake, tmp_path):
    spec = {
        **FAKE_PROFILE,
        "grid": FAKE_PROFILE["grid"] + [{"arch": ["revnet18"], "method": ["dsp"], "k": [2], "seed": [0]}],
    }
    path = tmp_path / "more.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(results.MissingRuns, match="1 of 5 runs"):
        results.collect(path, root=fake["root"])
    assert len(results.collect(path, root=fake["root"], allow_missing=True)["results"]) == 4


# --- tables -------------------------------------------------------------------------------------
def test_tables_hold_our_values_beside_the_papers(fake, cost_tables, tmp_path):
    paths = tables.render_all(fake["results_dir"], cost_tables, tmp_path, profile="fake")
    names = [*tables.TABLES, *(name for study in load_all(ROOT / "workflow/studies") for name in study.tables)]
    assert sorted(p.name for p in paths) == sorted(f"{n}.{f}" for n in names for f in ("md", "tex"))
    t2 = (tmp_path / "table2_accuracy.md").read_text()
    sd = pd.Series([71.25, 72.75]).std()
    assert (
        "| Backprop | RevNet18 | 12.2M | 0.177M | 1 |" in t2 and f"72.00 ± {sd:.2f} (n = 2)" in t2 and "| 94.9 |" in t2
    )
    petra = next(line for line in t2.splitlines() if line.startswith("| PETRA"))
    assert "| 2 |" in petra and "58.00 (n = 1)" in petra, "k picked on training accuracy (k=2), not on test"
    assert "PETRA RevNet18: 1, 2" in t2
    t2tex = (tmp_path / "table2_accuracy.tex").read_text()
    assert r"\toprule" in t2tex and r"72.00 $\pm$" in t2tex and r"\bottomrule" in t2tex
    t1 = (tmp_path / "table1_costs.md").read_text()
    assert "2(J−j)·FG = " in t1 and "| PETRA |" in t1 and "3J = 30.00" in t1
    t3 = (tmp_path / "table3_memory.md").read_text()
    assert "| 44.50 | 0.0 % | 44.45 |" in t3 and "What differs from the paper and why" in t3
    assert "30,391,144 parameters vs the authors' 30,421,608" in t3 and "Measured in the runs of profile `fake`" in t3
    assert "{{" not in t1 + t2 + t3 + t2tex


def test_templates_fail_on_a_missing_value(fake, cost_tables):
    frames = results.load(fake["results_dir"])
    context = tables.table2_context(frames, "fake")
    del context["rows"][0]["cells"]["cifar10"]["std"]
    with pytest.raises(jinja2.UndefinedError):
        tables.render("table2_accuracy", "md", context)
    context = tables.table3_context(costs.load(cost_tables), frames, "fake")
    del context["stem_gb"]
    with pytest.raises(jinja2.UndefinedError):
        tables.render("table3_memory", "md", context)


def test_number_formats():
    assert pm(72.0, 1.06, 2) == "72.0 ± 1.1 (n = 2)" and pm(58.0, float("nan"), 1, 2) == "58.00 (n = 1)"
    assert pm(None, None, 0) == "–" and pm(1.0, 0.5, 3, 1, tex=True) == r"1.0 $\pm$ 0.5 ($n = 3$)"
    assert pretty_expr("2*(J-j)/k") == "2(J−j)/k" and pretty_expr("3*J") == "3J"
    assert formula("1", 1.0) == "1" and formula("2*(J-j)", 14.0) == "2(J−j) = 14.00"
    assert tex("a_b 5% ±") == r"a\_b 5\% $\pm$"


def test_k_is_picked_on_training_accuracy_over_shared_seeds():
    runs = pd.DataFrame({"k": [1, 2, 2, 4], "seed": [0, 0, 1, 0], "train_acc": [46.0, 46.5, 43.8, 44.0]})
    group = pd.DataFrame({"k": [1, 2, 4], "top1_mean": [46.9, 46.3, 45.8]})
    # k=2 wins on seed 0, which every k has; its extra seed 1 does not count against it
    assert tables.pick_k(group, runs).k == 2
    assert tables.pick_k(group.iloc[[0]], runs).k == 1
    tie = pd.DataFrame({"k": [1, 2], "seed": [0, 0], "train_acc": [50.0, 50.0]})
    assert tables.pick_k(group.iloc[:2], tie).k == 1


# --- training budgets ------------------------------------------------------------------------------
BUDGET_PROFILE = {
    "profile": "fakebudget",
    "run_name": "{method}-k{k}-seed{seed}-e{epochs}",
    "train": {"dataset": "cifar10", "data_source": "nowhere.tar.gz", "arch": "revnet18", "width": 8, "batch_size": 32},
    "grid": [
        {"method": ["backprop", "petra", "delayed"], "k": 1, "seed": 0, "epochs": [2, 4, 8]},
        {"method": "petra", "k": 4, "seed": 0, "epochs": 8},
        {"method": ["backprop", "petra"], "k": 1, "seed": 1, "epochs": 8},
    ],
}
GAP = {2: -20.0, 4: -10.0, 8: -5.0}  # PETRA's gap halves at each doubling


def write_budget_run(run_dir, cfg):
    top1 = 70.0 + cfg["epochs"] + (0.5 * cfg["seed"] if cfg["method"] == "backprop" else 0.0)
    if cfg["method"] != "backprop":
        top1 += GAP[cfg["epochs"]] * (1.5 if cfg["method"] == "delayed" else 1.0) + (1.0 if cfg["k"] == 4 else 0.0)
    history = [
        {
            "epoch": e,
            "train_loss": 1.0,
            "train_acc": top1 + 10,
            "test_loss": 1.0,
            "top1": top1,
            "top5": 99.0,
            "lr": 0.1,
            "images_per_s": 1.0,
            "wall_time_s": 1.0,
            "eval_time_s": 0.1,
        }
        for e in range(1, cfg["epochs"] + 1)
    ]
    metrics = {
        "top1": top1,
        "top5": 99.0,
        "test_loss": 1.0,
        "train_loss": 1.0,
        "train_acc": top1 + 10,
        "best_top1": top1,
        "top1_last10_mean": top1,
        "epochs": cfg["epochs"],
        "optimizer_steps": 250 * cfg["epochs"] // cfg["k"],
        "peak_kept_bytes": [0] * 10,
        "images_per_s": 1.0,
        "wall_time_s": 1.0,
        "params": 177_274,
        "stages": 10,
        "stage_kinds": "S R R D R D R D R H",
        "top1_bn_reestimated": top1 + (3.0 if cfg["method"] != "backprop" else 1.0),
    }
    write_records(run_dir, cfg, metrics, history)


@pytest.fixture(scope="module")
def budget(tmp_path_factory, cost_tables):
    return profile_results(tmp_path_factory, BUDGET_PROFILE, write_budget_run)


def test_the_gap_is_taken_against_backprop_at_the_same_budget(budget):
    from petra_core.report.budget import gap_frame, paper_point, trend

    frame = gap_frame(budget["summary"], budget["results"])
    petra = frame[(frame.method == "petra") & (frame.k == 1)].set_index("minibatches")
    assert list(petra.index) == [500, 1000, 2000]
    assert petra.gap_top1.tolist() == pytest.approx([-20.0, -10.0, -5.0 - 0.25])  # backprop at 8 epochs: 2 seeds
    assert petra.gap_top1_bn_reestimated.tolist() == pytest.approx([-18.0, -8.0, -3.25])
    assert petra.loc[2000, "n"] == 2 and not math.isnan(petra.loc[2000, "gap_top1_err"])
    paper = paper_point(load_paper_reference())
    assert paper == {"minibatches": 234375, "gap": 0.0, "epochs": 300, "batch": 64}
    fit = trend(frame, "petra", 1, paper["minibatches"])
    assert fit["monotonic"] and fit["kind"] == "power" and 0.4 < fit["factor_per_doubling"] < 0.6
    assert -1.0 < fit["predicted_gap"] < 0


def test_a_gap_that_closed_inside_the_budgets_is_not_extrapolated():
    """A gap at or above 0 at the largest budget (e.g. -13, -4, +0.2) has closed: a straight line
    through it would predict a method beating backprop by ever more points at the paper's budget."""
    from petra_core.report.budget import trend, trend_curve

    frame = pd.DataFrame(
        {"method": "delayed", "k": 1, "minibatches": [1250, 2500, 5000, 10000], "gap_top1": [-13.0, -4.0, 0.5, 0.2]}
    )
    fit = trend(frame, "delayed", 1, 234375)
    assert fit["kind"] == "closed" and fit["closed_at"] == 5000 and math.isnan(fit["predicted_gap"])
    assert not fit["monotonic"] and trend_curve(fit, [1e4, 1e5]) == []
    frame.loc[3, "gap_top1"] = -0.1  # closed, then below 0 again at the largest budget: fitted as before
    assert trend(frame, "delayed", 1, 234375)["kind"] == "line"


def test_a_trend_says_how_far_the_seeds_spread_moves_it():
    """The fit uses the mean gaps; a parametric bootstrap over each budget's ± gives a 16-84 %
    interval that holds the fit, narrows with the spread, is a point without spread, and is
    absent when no budget has more than one seed."""
    from petra_core.report.budget import trend

    def fit(errs):
        frame = pd.DataFrame(
            {
                "method": "petra",
                "k": 1,
                "minibatches": [1250, 2500, 5000, 10000, 20000],
                "gap_top1": [-16.0, -12.0, -8.0, -3.0, -0.6],
                "gap_top1_err": errs,
            }
        )
        return trend(frame, "petra", 1, 234375)

    wide, narrow = fit([1.0, 1.0, 0.8, 0.5, 0.2]), fit([0.1, 0.1, 0.08, 0.05, 0.02])
    for f in (wide, narrow):
        lo, hi = f["uncertainty"]["slope"]
        assert lo < f["factor_per_doubling"] < hi
        lo, hi = f["uncertainty"]["predicted"]
        assert lo < f["predicted_gap"] < hi and f["uncertainty"]["assumed"] == 0
    assert wide["uncertainty"]["slope"][1] - wide["uncertainty"]["slope"][0] > 3 * (
        narrow["uncertainty"]["slope"][1] - narrow["uncertainty"]["slope"][0]
    )
    partly = fit([float("nan"), float("nan"), float("nan"), float("nan"), 0.2])
    assert partly["uncertainty"]["assumed"] == 4  # they take the median known spread
    still = fit([0.0] * 5)["uncertainty"]
    assert still["slope"][0] == pytest.approx(still["slope"][1])
    assert fit([float("nan")] * 5)["uncertainty"] is None


def test_budget_profiles_render_table_2_at_their_largest_budget(budget, cost_tables, tmp_path):
    out = tmp_path / "results"
    results.write({name: budget[name] for name in results.FRAMES}, out)
    tables.render_all(out, cost_tables, tmp_path, profile="fakebudget")
    t2 = (tmp_path / "table2_accuracy.md").read_text()
    assert "Each model is reported at its largest training budget" in t2
    assert "| Backprop | RevNet18 | 12.2M | 0.177M | 1 | 2,000 | 94.9 | 78.25 ± 0.35 (n = 2) | – | – |" in t2
    assert "78.25 ± 0.35 (n = 2)" in t2  # backprop at 8 epochs, two seeds
    gap = (tmp_path / "budget_gap.md").read_text()
    assert "| 2,000 | 8 | 78.25 ± 0.35 (n = 2) |" in gap and "234,375" in gap and "| PETRA k=1 | as trained |" in gap
    from petra_core.report.figures import draw_all

    paths = draw_all(out, cost_tables, tmp_path / "figures", profile="fakebudget")
    assert tmp_path / "figures" / "budget_gap.png" in paths


# --- several depths in one budget profile: RevNet18's 10 stages, RevNet34's 18 ---------------------
DEPTH_PROFILE = {
    "profile": "fakedepth",
    "run_name": "{method}-k{k}-seed{seed}-e{epochs}",
    "train": {"dataset": "cifar10", "data_source": "nowhere.tar.gz", "width": 8, "batch_size": 32},
    "grid": [
        {"arch": "revnet18", "method": ["backprop", "petra"], "k": 1, "seed": 0, "epochs": [2, 4, 8]},
        {"arch": "revnet34", "method": ["backprop", "petra"], "k": 1, "seed": [0, 1], "epochs": [2, 4]},
        {"arch": "resnet34", "method": "backprop", "k": 1, "seed": 0, "epochs": 4},
    ],
}
DEPTH_GAP = {"revnet18": {2: -20.0, 4: -10.0, 8: -5.0}, "revnet34": {2: -30.0, 4: -20.0}}
STAGES = {"revnet18": "S R R D R D R D R H", "revnet34": "S " + "R " * 16 + "H", "resnet34": "S " + "B " * 16 + "H"}


def write_depth_run(run_dir, cfg):
    top1 = 70.0 + cfg["epochs"] + cfg["seed"]
    if cfg["method"] != "backprop":
        top1 += DEPTH_GAP[cfg["arch"]][cfg["epochs"]]
    kinds = STAGES[cfg["arch"]]
    history = [
        {
            "epoch": e,
            "train_loss": 1.0,
            "train_acc": top1 + 10,
            "test_loss": 1.0,
            "top1": top1,
            "top5": 99.0,
            "lr": 0.1,
            "images_per_s": 1.0,
            "wall_time_s": 1.0,
            "eval_time_s": 0.1,
        }
        for e in range(1, cfg["epochs"] + 1)
    ]
    n = len(kinds.split())
    metrics = {
        "top1": top1,
        "top5": 99.0,
        "test_loss": 1.0,
        "train_loss": 1.0,
        "train_acc": top1 + 10,
        "best_top1": top1,
        "top1_last10_mean": top1,
        "epochs": cfg["epochs"],
        "optimizer_steps": 250 * cfg["epochs"],
        "images_per_s": 1.0,
        "wall_time_s": 1.0,
        "params": 300_000,
        "peak_kept_bytes": [(2_000_000 if cfg["method"] == "backprop" else 500_000)] * n,
        "stages": n,
        "stage_kinds": kinds,
        "top1_bn_reestimated": top1,
    }
    write_records(run_dir, cfg, metrics, history)


@pytest.fixture(scope="module")
def depth(tmp_path_factory):
    return profile_results(tmp_path_factory, DEPTH_PROFILE, write_depth_run)


def test_a_budget_profile_of_several_depths_has_a_series_and_a_trend_per_depth(depth, cost_tables, tmp_path):
    """RevNet34 (18 stages) next to RevNet18 (10): one table and one trend per model, each model at
    its own largest budget in Table 2 (RevNet34 stops at 4 epochs), ResNet34 beside them, and the
    bytes kept against backprop's in Table 3's measured part."""
    from petra_core.report.budget import at_largest_budget, gap_frame, trend

    frame = gap_frame(depth["summary"], depth["results"])
    assert set(zip(frame.arch, frame.num_stages)) == {("revnet18", 10), ("revnet34", 18)}
    with pytest.raises(ValueError, match="several models"):
        trend(frame, "petra", 1, 234375)
    deep = trend(frame, "petra", 1, 234375, arch="revnet34")
    assert deep["kind"] == "power" and deep["factor_per_doubling"] == pytest.approx(20 / 30)
    largest = at_largest_budget(depth["summary"]).set_index(["arch", "method"]).epochs
    assert largest.to_dict() == {
        ("revnet18", "backprop"): 8,
        ("revnet18", "petra"): 8,
        ("revnet34", "backprop"): 4,
        ("revnet34", "petra"): 4,
        ("resnet34", "backprop"): 4,
    }
    context = tables.budget_context(depth, "fakedepth")
    assert [(m["model"], m["num_stages"]) for m in context["models"]] == [("RevNet18", 10), ("RevNet34", 18)]
    out = tmp_path / "results"
    results.write({name: depth[name] for name in results.FRAMES}, out)
    tables.render_all(out, cost_tables, tmp_path, profile="fakedepth")
    gap = (tmp_path / "budget_gap.md").read_text()
    assert "#### RevNet34, 18 stages" in gap and "| RevNet34: PETRA k=1 | as trained | × 0.67" in gap
    t2 = (tmp_path / "table2_accuracy.md").read_text()
    assert "| Backprop | ResNet34 |" in t2 and "| PETRA | RevNet34 |" in t2 and "95.3" in t2  # the paper's RevNet34
    assert "| 74.50 ± 0.71 (n = 2) |" in t2  # RevNet34 backprop at its own largest budget, 4 epochs
    petra34 = next(line for line in t2.splitlines() if line.startswith("| PETRA | RevNet34 |"))
    assert petra34.endswith("| 1,000 | 94.8 | 54.50 ± 0.71 (n = 2) | -0.5 | -20.00 |")  # gap at the same budget
    t3 = (tmp_path / "table3_memory.md").read_text()
    # 18 stages of 0.5 MB: 16 reversible (8.0 MB), stem and head (1.0 MB)
    assert "| CIFAR-10 | RevNet34 | 18 | 8 | PETRA | 1 | 9.0 | 0.25 | 0.5 | 8.0 | 1.0 | 2 |" in t3
    assert "PETRA's reversible stages keep at most 8.0 MB\n(RevNet18, 10 stages; RevNet34, 18 stages)" in t3
    from petra_core.report.figures import budget_gap

    fig = budget_gap(depth["summary"], depth["results"], "fakedepth", load_paper_reference())
    labels = [t.get_text() for t in fig.legends[0].get_texts()]  # one legend below both panels
    assert any(label.startswith("RevNet34 (18 stages): PETRA k=1") for label in labels)
    assert any(label.startswith("RevNet34 (18 stages): PETRA k=1: trend,") for label in labels)


# --- replica rules (the cdp profile) -------------------------------------------------------------
RULE_PROFILE = {
    "profile": "fakecdp",
    "run_name": "{replica_rule}-seed{seed}",
    "train": {
        "dataset": "cifar10",
        "data_source": "nowhere.tar.gz",
        "width": 8,
        "epochs": 2,
        "batch_size": 32,
        "method": "backprop",
        "replicas": 4,
    },
    "grid": [
        {"arch": ["resnet18", "revnet18"], "replica_rule": "dp", "seed": [0, 1]},
        {"arch": ["resnet18", "revnet18"], "replica_rule": ["cdp1", "cdp2"], "rule_stages": 4, "seed": [0, 1]},
    ],
}
RULE_TOP1 = {"dp": 70.0, "cdp1": 68.0, "cdp2": 69.5}


def write_rule_run(run_dir, cfg):
    top1 = RULE_TOP1[cfg["replica_rule"]] + cfg["seed"] + (1.0 if cfg["arch"] == "revnet18" else 0.0)
    history = [
        {
            "epoch": e,
            "train_loss": 1.0 / e,
            "train_acc": 50.0,
            "test_loss": 1.0,
            "top1": top1 - 2 + e,
            "top5": 99.0,
            "lr": 0.1,
            "images_per_s": 1.0,
            "wall_time_s": 1.0,
            "eval_time_s": 0.1,
        }
        for e in (1, 2)
    ]
    metrics = {
        "top1": top1,
        "top5": 99.0,
        "test_loss": 1.0,
        "train_loss": 0.5,
        "train_acc": 50.0,
        "best_top1": top1,
        "top1_last10_mean": top1,
        "epochs": 2,
        "optimizer_steps": 10,
        "peak_kept_bytes": [0] * 10,
        "images_per_s": 1.0,
        "wall_time_s": 1.0,
        "params": 1,
        "stages": 10,
        "stage_kinds": "S R R D R D R D R H",
        "top1_bn_reestimated": top1 + 0.5,
    }
    write_records(run_dir, cfg, metrics, history)


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    return profile_results(tmp_path_factory, RULE_PROFILE, write_rule_run)


def test_replica_rules_are_compared_with_dp_of_the_same_model(rules):
    from petra_core.report.replicas import rule_context, rule_frame

    frame = rule_frame(rules["summary"]).set_index(["arch", "replica_rule"])
    assert frame.loc[("resnet18", "dp"), "top1"] == pytest.approx(70.5)  # seeds 0 and 1
    assert frame.loc[("resnet18", "cdp1"), "gap_top1"] == pytest.approx(-2.0)
    assert frame.loc[("revnet18", "cdp2"), "gap_top1"] == pytest.approx(-0.5)
    assert frame.loc[("revnet18", "cdp2"), "gap_top1_err"] == pytest.approx(math.sqrt(0.5 + 0.5))
    context = rule_context(rules, "fakecdp")
    assert context["applies"] and [m["model"] for m in context["models"]] == ["ResNet18", "RevNet18"]
    assert [r["label"] for r in context["models"][0]["rules"]] == ["DP", "CDP1 (L = 4)", "CDP2 (L = 4)"]
    from petra_core.report.tables import render

    md = render("replica_rules", "md", context)
    assert (
        "| ResNet18 | CDP1 (L = 4) | 68.50 ± 0.71 (n = 2) | -2.00 ± 1.00 | 69.00 ± 0.71 (n = 2) | -2.00 ± 1.00 |" in md
    )
    assert "| ResNet18 | DP | 70.50 ± 0.71 (n = 2) | – |" in md
    assert "\\begin{tabular}" in render("replica_rules", "tex", context)
    assert "have been gathered" in render("replica_rules", "md", rule_context({"summary": pd.DataFrame()}, "x"))
    one_rule = rules["summary"][rules["summary"].replica_rule == "dp"]
    assert "varies no replica rule" in render("replica_rules", "md", rule_context({"summary": one_rule}, "x"))


def test_the_replica_rule_table_reads_its_own_profile_whatever_the_report_renders(budget, rules, cost_tables, tmp_path):
    """A clone renders the budget profile; the replica-rule table and curves come from results/cdp."""
    budget_dir, rules_dir = tmp_path / "budget", tmp_path / "fakecdp"
    results.write({name: budget[name] for name in results.FRAMES}, budget_dir)
    results.write({name: rules[name] for name in results.FRAMES}, rules_dir)
    tables.render_all(budget_dir, cost_tables, tmp_path / "t", profile="budget", study_dirs={"cdp": rules_dir})
    md = (tmp_path / "t" / "replica_rules.md").read_text()
    assert "profile `fakecdp`" in md and "| RevNet18 | CDP2 (L = 4) |" in md
    assert "results/fakecdp/summary.csv" in md
    tables.render_all(
        budget_dir, cost_tables, tmp_path / "t", profile="budget", study_dirs={"cdp": tmp_path / "nothing"}
    )
    assert "have been gathered" in (tmp_path / "t" / "replica_rules.md").read_text()


def test_replica_rule_curves_draw_one_line_per_rule(rules):
    from petra_core.report.replicas import rule_curves

    fig = rule_curves(rules["history"], "fakecdp")
    assert len(fig.axes) == 4  # two models x (training loss, top-1)
    assert [t.get_text() for t in fig.axes[1].get_legend().get_texts()] == ["DP", "CDP1 (L = 4)", "CDP2 (L = 4)"]


# --- populations (the wash profile) ---------------------------------------------------------------
POP_PROFILE = {
    "profile": "fakewash",
    "run_name": "{replica_rule}-seed{seed}",
    "train": {
        "dataset": "cifar10",
        "data_source": "nowhere.tar.gz",
        "width": 8,
        "epochs": 2,
        "batch_size": 32,
        "method": "backprop",
        "replicas": 4,
    },
    "grid": [
        {"arch": "resnet18", "replica_rule": "independent", "seed": 0},
        {"arch": "resnet18", "replica_rule": "papa", "seed": [0, 1]},
        {"arch": "resnet18", "replica_rule": "wash", "rule_options": {"p": 0.01}, "seed": [0, 1]},
        {
            "arch": "resnet18",
            "replica_rule": "wash",
            "rule_options": {"p": 0.05},
            "seed": 0,
            "run_name": "wash-p0.05-seed{seed}",
        },
    ],
}
POP = {"independent": (70.0, 74.0, 20.0, 10.0), "papa": (71.0, 73.0, 72.0, 70.0), "wash": (71.5, 74.5, 73.5, 73.0)}
FLOATS = {"independent": 0.0, "papa": 1000.0, "wash": 40.0}


def write_pop_run(run_dir, cfg):
    members, ensemble, average, average_raw = POP[cfg["replica_rule"]]
    p = (cfg.get("rule_options") or {}).get("p", 0.0)
    members += cfg["seed"] + 10 * p
    history = [
        {
            "epoch": e,
            "train_loss": 1.0 / e,
            "train_acc": 50.0,
            "test_loss": 1.0,
            "top1": members,
            "top5": 99.0,
            "lr": 0.1,
            "images_per_s": 1.0,
            "wall_time_s": 1.0,
            "eval_time_s": 0.1,
        }
        for e in (1, 2)
    ]
    metrics = {
        "top1": members,
        "top5": 99.0,
        "test_loss": 1.0,
        "train_loss": 0.5,
        "train_acc": 50.0,
        "best_top1": members,
        "top1_last10_mean": members,
        "epochs": 2,
        "optimizer_steps": 10,
        "peak_kept_bytes": [0] * 10,
        "images_per_s": 1.0,
        "wall_time_s": 1.0,
        "params": 1,
        "stages": 10,
        "stage_kinds": "S B B B B B B B B H",
        "top1_bn_reestimated": members,
        "floats_sent_per_step": FLOATS[cfg["replica_rule"]] * (1 + 100 * p),
        "population": {
            "replicas": 4,
            "members_top1": [members] * 4,
            "members_top1_mean": members,
            "ensemble_top1": ensemble,
            "average_top1": average_raw,
            "average_top1_bn_reestimated": average + cfg["seed"],
        },
    }
    write_records(run_dir, cfg, metrics, history)


@pytest.fixture(scope="module")
def populations(tmp_path_factory):
    return profile_results(tmp_path_factory, POP_PROFILE, write_pop_run)


def test_populations_are_tabled_with_their_communication_against_papas(populations):
    from petra_core.report.population import population_context, population_figure, population_frame
    from petra_core.report.tables import render

    frame = population_frame(populations["summary"]).set_index("label")
    assert list(frame.index) == ["Independent", "PAPA", "WASH (p = 0.01)", "WASH (p = 0.05)"]
    assert frame.loc["WASH (p = 0.01)", "floats_vs_papa"] == pytest.approx(80.0 / 1000.0)
    assert frame.loc["PAPA", "pop_average_top1_bn_reestimated"] == pytest.approx(72.5)  # seeds 0, 1
    assert frame.loc["PAPA", "n"] == 2
    md = render("populations", "md", population_context(populations, "fakewash"))
    assert "| ResNet18 | WASH (p = 0.01) | 72.10 ± 0.71 (n = 2) | 74.50 ± 0.00 (n = 2) |" in md, md
    assert "| 80 | 0.080 |" in md and "| 0 | 0.000 |" in md
    assert "\\begin{tabular}" in render("populations", "tex", population_context(populations, "fakewash"))
    fig = population_figure(populations["summary"], "fakewash")
    assert fig.axes[0].get_xscale() == "log"


def test_the_population_verdict_is_the_datas(populations):
    """ "Does the averaged WASH model reach the ensemble" is answered from the records: WASH's main
    setting (most seeds) against its own ensemble and the independent models', within the larger sd."""
    from petra_core.report.population import _reaches, population_context, population_frame, verdicts
    from petra_core.report.tables import render

    (v,) = verdicts(population_frame(populations["summary"]))
    assert v["wash"] == "WASH (p = 0.01)" and v["n"] == 2  # p = 0.05 has one seed
    assert v["average"] == pytest.approx(74.0) and v["ensemble"] == pytest.approx(74.5)
    assert v["gap_own"] == pytest.approx(-0.5) and v["reaches_own"]  # sd of the average 0.71 > 0.5
    assert v["independent_ensemble"] == pytest.approx(74.0) and v["naive_average"] == pytest.approx(10.0)
    assert v["papa_average"] == pytest.approx(72.5) and v["floats_vs_papa"] == pytest.approx(0.08)
    assert not _reaches(74.0, 0.2, 75.0, 0.3) and _reaches(74.8, 0.2, 75.0, float("nan"))
    md = render("populations", "md", population_context(populations, "fakewash"))
    assert "against its own ensemble 74.50 ± 0.00 (n = 2) (-0.50: reaches it)" in md, md


# --- ACCO and its baselines (the acco profile) -------------------------------------------------------
ACCO_PROFILE = {
    "profile": "fakeacco",
    "run_name": "{optimizer}-{replica_rule}-seed{seed}",
    "train": {
        "dataset": "cifar10",
        "data_source": "nowhere.tar.gz",
        "arch": "resnet18",
        "width": 8,
        "epochs": 10,
        "batch_size": 32,
        "k": 2,
        "method": "backprop",
        "replicas": 4,
        "eval_every": 1,
    },
    "grid": [
        {"optimizer": ["sgd", "adamw"], "replica_rule": ["zero1", "acco"], "seed": [0, 1]},
        {
            "optimizer": "sgd",
            "replica_rule": "dpu",
            "rule_options": [{"warmup": 0}, {"warmup": 5}],
            "seed": [0, 1],
            "run_name": "{optimizer}-dpu-w{rule_options[warmup]}-seed{seed}",
        },
    ],
}
ACCO_LOSS = {"zero1": 1.0, "acco": 1.02, "dpu": 1.5}  # the loss at epoch 1; dpu w5 lags less


def write_acco_run(run_dir, cfg):
    base = ACCO_LOSS[cfg["replica_rule"]] - (0.3 if (cfg.get("rule_options") or {}).get("warmup") else 0.0)
    history = [
        {
            "epoch": e,
            "train_loss": base / e + 0.01 * cfg["seed"],
            "train_acc": 50.0,
            "test_loss": 1.0,
            "top1": 50.0 + 3 * e - 10 * base + cfg["seed"],
            "top5": 99.0,
            "lr": 0.1,
            "images_per_s": 1.0,
            "wall_time_s": 1.0,
            "eval_time_s": 0.1,
        }
        for e in range(1, 11)
    ]
    last = history[-1]
    metrics = {
        "top1": last["top1"],
        "top5": 99.0,
        "test_loss": 1.0,
        "train_loss": last["train_loss"],
        "train_acc": 50.0,
        "best_top1": last["top1"],
        "top1_last10_mean": last["top1"],
        "epochs": 10,
        "optimizer_steps": 620,
        "peak_kept_bytes": [0] * 10,
        "images_per_s": 1.0,
        "wall_time_s": 1.0,
        "params": 1,
        "stages": 10,
        "stage_kinds": "S B B B B B B B B H",
        "floats_sent_per_step": 10.0,
    }
    write_records(run_dir, cfg, metrics, history)


@pytest.fixture(scope="module")
def acco_runs(tmp_path_factory):
    return profile_results(tmp_path_factory, ACCO_PROFILE, write_acco_run)


def test_acco_is_tabled_early_and_at_the_end_against_ddp_of_the_same_optimizer(acco_runs):
    from petra_core.report.acco import acco_context, acco_figure, acco_frame
    from petra_core.report.tables import render

    frame = acco_frame(acco_runs["results"], acco_runs["history"])
    sgd = frame[frame.optimizer == "sgd"].set_index("label")
    assert list(sgd.index) == ["DDP (ZeRO-1)", "DPU, no warm-up", "DPU, 5 warm-up steps", "ACCO"]
    assert set(frame.early_epoch) == {1}  # the first evaluated epoch at or past 10 % of 10
    assert sgd.loc["ACCO", "early_train_loss"] == pytest.approx(1.02 + 0.005)  # seeds 0 and 1
    assert sgd.loc["DPU, no warm-up", "gap_early_train_loss"] == pytest.approx(0.5)
    assert sgd.loc["ACCO", "gap_top1"] == pytest.approx(-0.2)
    assert sgd.loc["ACCO", "n"] == 2
    context = acco_context(acco_runs, "fakeacco")
    assert [g["optimizer"] for g in context["groups"]] == ["SGD (Nesterov)", "AdamW"]
    md = render("acco", "md", context)
    assert "**ResNet18, AdamW** (early: epoch 1)" in md
    assert "| DPU, no warm-up | 1.505 ± 0.007 (n = 2) | +0.500 ± 0.010 |" in md, md
    assert "\\begin{tabular}" in render("acco", "tex", context)
    fig = acco_figure(acco_runs, "fakeacco")
    assert len(fig.axes) == 4  # two optimizers x (training loss, top-1)
    assert fig.axes[0].get_xlabel() == "optimizer steps"


def test_the_acco_verdict_is_the_datas(acco_runs):
    """The claim (ACCO ends level with DDP, DPU without warm-up lags early and ACCO is ahead of it)
    is judged from the records: it holds in the fake SGD runs, cannot be judged where a setting has
    no DPU (AdamW here), and fails as soon as ACCO's final top-1 falls behind DDP's beyond noise."""
    from petra_core.report.acco import acco_context, acco_frame, verdicts
    from petra_core.report.tables import render

    frame = acco_frame(acco_runs["results"], acco_runs["history"])
    sgd, adamw = verdicts(frame)
    assert (sgd["optimizer"], adamw["optimizer"]) == ("SGD (Nesterov)", "AdamW")
    assert sgd["acco_level"] and sgd["claim_holds"]
    w0, w5 = sgd["dpu"]
    assert (w0["warmup"], w5["warmup"]) == (0, 5)
    assert w0["lags_early"] and w0["early"]["early_train_loss"]["gap"] == pytest.approx(0.5)
    assert w0["acco_ahead"] == pytest.approx(1.505 - 1.025) and w0["acco_is_ahead"]
    assert sgd["acco"]["top1"]["gap"] == pytest.approx(-0.2) and sgd["acco"]["top1"]["within"]
    assert adamw["dpu"] == [] and adamw["claim_holds"] is None
    behind = frame.copy()
    behind.loc[behind.rule == "acco", "gap_top1"] = -5.0  # five points behind, sd 1: beyond noise
    judged = verdicts(behind)[0]
    assert judged["acco_level"] is False and judged["claim_holds"] is False
    assert judged["failed"] == ["ACCO ends behind DDP"]
    md = render("acco", "md", acco_context(acco_runs, "fakeacco"))
    assert "- **ResNet18, SGD (Nesterov).** ACCO against DDP:" in md, md
    assert "DPU, no warm-up: early train loss +0.500 ± 0.010 against DDP (lags)" in md, md
    assert (
        md.count("The claim holds.") == 1
        and "The claim cannot be judged: there is no DPU without warm-up to compare." in md
    )


def test_the_readmes_benchmarks_are_rendered_from_benchmark_records(tmp_path, monkeypatch):
    """A benchmark run with --record writes results/benchmarks/<benchmark>-<variant>.json (result,
    command, revision, CPU, load); `petra readme` renders README's benchmarks block from them, and
    says when a record was taken on a busy machine."""
    import sys

    from petra_core.report.benchmarks import Recorder, load
    from petra_core.report.readme import render_benchmarks

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(root / "benchmarks"))
    import bench_speed

    assert "No benchmark has been recorded yet" in render_benchmarks(tmp_path / "results")
    monkeypatch.setattr(sys, "argv", ["benchmarks/bench_speed.py", "--width", "4", "--steps", "1", "--blocks", "1"])
    bench_speed.main(["--width", "4", "--batch", "8", "--steps", "1", "--blocks", "1", "--record"])
    for name, result in {
        "bench_methods": {
            "arch": "revnet18",
            "width": 64,
            "batch": 64,
            "threads": 2,
            "channels_last": True,
            "steps": 8,
            "ideal_flop_ratio": {"backprop": 1.0, "petra": 4 / 3},
            "methods": {
                "backprop": {
                    "s_per_batch": 1.5,
                    "peak_rss_MiB": 1800.0,
                    "time_vs_backprop": 1.0,
                    "rss_vs_backprop": 1.0,
                },
                "petra": {"s_per_batch": 2.0, "peak_rss_MiB": 2700.0, "time_vs_backprop": 1.38, "rss_vs_backprop": 1.5},
            },
        },
        "bench_dp": {
            "method": "backprop",
            "width": 32,
            "batch": 64,
            "replicas": 2,
            "dp_images_per_s": 180.0,
            "one_thread_images_per_s": 100.0,
            "two_threads_images_per_s": 170.0,
            "vs_one_thread": 1.8,
            "vs_two_threads": 1.06,
        },
    }.items():
        Recorder(name, "fake").write(result)
    records = load(tmp_path / "results" / "benchmarks")
    assert set(records) == {"bench_speed-revnet18-w4-t1-cl", "bench_methods-fake", "bench_dp-fake"}
    assert records["bench_speed-revnet18-w4-t1-cl"]["command"].startswith("python benchmarks/bench_speed.py")
    block = render_benchmarks(tmp_path / "results")
    assert "× a plain PyTorch loop" in block and "× our backprop (ideal FLOP ratio 1.33)" in block
    assert (
        "petra 1.38 (ideal 1.33)" in block and "petra 1.50" in block and "threads, channels-last, one process" in block
    )
    assert "1.80 × the images/s of one process with 1 thread" in block
    record = tmp_path / "results" / "benchmarks" / "bench_dp-fake.json"
    for other, says in [
        (0.02, "other processes used 0.02 cores meanwhile)"),
        (1.9, "other processes used 1.90 cores meanwhile: **a busy machine**"),
    ]:
        rec = json.loads(record.read_text())
        rec["other_cpu_cores"] = other
        record.write_text(json.dumps(rec))
        assert says in render_benchmarks(tmp_path / "results")


def test_a_benchmark_record_measures_the_cpu_other_processes_use(monkeypatch):
    """The recorder subtracts its own process's (and waited children's) CPU from the machine's busy
    time, over the wall time since it opened: other processes' mean cores. Checked on fixed
    readings (a timed spinner would test the machine's load, not the arithmetic)."""
    from petra_core.report import benchmarks

    readings = {"machine": 100.0, "own": 10.0, "clock": 50.0}
    monkeypatch.setattr(benchmarks, "_machine_busy_s", lambda: readings["machine"])
    monkeypatch.setattr(benchmarks, "_own_busy_s", lambda: readings["own"])
    monkeypatch.setattr(benchmarks.time, "monotonic", lambda: readings["clock"])
    rec = benchmarks.Recorder("bench_fake", "other")
    readings.update(machine=103.0, own=11.0, clock=52.0)  # 3 s busy, 1 s of it ours, over 2 s
    assert rec.other_cpu() == pytest.approx(1.0)
    readings.update(own=14.0)  # our children's time can exceed the machine's delta (clock ticks): never negative
    assert rec.other_cpu() == 0.0
    readings.update(machine=None)  # no /proc/stat: not measured, not zero
    assert rec.other_cpu() is None


def test_the_machine_busy_time_is_read_from_proc_stat():
    from petra_core.report import benchmarks

    first = benchmarks._machine_busy_s()
    if first is None:
        pytest.skip("no /proc/stat: other processes' CPU is not measured here")
    sum(range(10**6))  # some CPU
    assert 0 < first <= benchmarks._machine_busy_s()


def test_the_readmes_results_are_what_the_committed_records_give():
    """README.md's "Results at a glance" is rendered by `petra readme`, never typed by hand."""
    from petra_core.report.readme import render_block, stale

    root = Path(__file__).resolve().parents[1]
    assert not stale(root / "README.md", root / "results", root / "workflow/studies", doc=None), (
        "README.md's results block is stale: run `petra readme`\n"
        + render_block(root / "results", root / "workflow/studies")
    )
    block = render_block(root / "results", root / "workflow/studies")
    assert "PETRA (k = 1) minus" in block and "Table 3" in block


def test_reproducing_mds_expected_values_are_rendered_and_checked(tmp_path):
    """docs/reproducing.md's expected values are generated blocks: the committed file is what the
    records give, and `petra readme --check` fails on a copy where one figure was typed over."""
    from petra_core.report.readme import DOC_BLOCKS, doc_markers, stale

    root = Path(__file__).resolve().parents[1]
    doc = root / "docs/reproducing.md"
    args = (root / "README.md", root / "results", root / "workflow/studies")
    assert stale(*args, doc=doc) == [], "docs/reproducing.md's expected values are stale: run `petra readme`"
    text = doc.read_text()
    for name in DOC_BLOCKS:
        begin, end = doc_markers(name)
        assert text.count(begin) == 1 and text.count(end) == 1, name
    begin, end = doc_markers("cpu-table2")
    block = text[text.index(begin) : text.index(end)]
    assert "45.18 ± 0.08 (n = 2)" in block and "46.95 (n = 1)" in block  # the records' values, n beside each
    typed = tmp_path / "reproducing.md"
    typed.write_text(text.replace("46.95 (n = 1)", "48.00 (n = 1)", 1))
    assert stale(*args, doc=typed) == [str(typed)]
    from petra_core.cli import main as cli_main

    def check(doc_file):
        return cli_main(
            ["readme", "--check", "--readme", str(args[0]), "--results", str(args[1]), "--studies", str(args[2])]
            + ["--doc", str(doc_file)]
        )

    assert check(typed) == 1
    assert check(doc) == 0


def test_a_gap_shows_its_spread_only_where_both_sides_have_several_runs():
    """README's gap per budget: where the method or backprop has one seed, the gap has no ±
    (backprop's spread alone is not the gap's), and each gap names both n."""
    env = tables.environment()
    source = env.loader.get_source(env, "readme_results.md.j2")[0]
    macros = "".join(line + "\n" for line in source.splitlines() if line.startswith("{% macro "))
    gap = env.from_string(macros).module.gap  # the template's own macros, without its body's context
    assert str(gap(dict(gap=-0.88, err=0.15, n=1, backprop_n=2))) == "-0.88 (n = 1/2)"
    assert str(gap(dict(gap=-0.88, err=0.15, n=2, backprop_n=1))) == "-0.88 (n = 2/1)"
    assert str(gap(dict(gap=-16.84, err=0.64, n=3, backprop_n=3))) == "-16.84 ± 0.64 (n = 3/3)"
    root = Path(__file__).resolve().parents[1]
    from petra_core.report.readme import render_block

    assert "(n = 3/3)" in render_block(root / "results", root / "workflow/studies"), "the committed block names n"


def test_readme_says_how_a_deeper_models_gap_compares_with_the_10_stage_gap(depth):
    """README's sentence per deeper model: its gap per budget, as a multiple of RevNet18's at the same
    budget, its trend and the paper's own gap for that model (RevNet34: 94.8 - 95.3)."""
    from petra_core.report.readme import _deeper

    context = tables.budget_context(depth, "fakedepth")
    shallow, deep = context["models"]
    petra = [s["method"] for s in shallow["series"]].index("petra")
    headline = {r["minibatches"]: r["cells"]["top1"]["series"][petra]["gap"] for r in shallow["rows"]}
    d = _deeper(deep, headline, shallow["num_stages"])
    assert (d["model"], d["stages"], d["shallow_stages"]) == ("RevNet34", 18, 10)
    assert [(r["minibatches"], r["gap"], r["ratio"]) for r in d["rows"]] == [(500, -30.0, 1.5), (1000, -20.0, 2.0)]
    assert d["paper_gap"] == pytest.approx(-0.5) and d["fit"]["factor_per_doubling"] == pytest.approx(20 / 30)


def test_petra_plot_draws_two_committed_runs(tmp_path, capsys):
    """`petra plot RUN_DIR RUN_DIR --out FILE.png`: a PNG of their loss, accuracy and lr per epoch,
    byte-stable (the same bits when drawn again); a directory without history.json is one line."""
    from petra_core.cli import main as cli_main

    root = Path(__file__).resolve().parents[1] / "runs/budget/cifar10/revnet18-w8"
    runs = [str(root / "backprop-k1-seed0-e5"), str(root / "petra-k1-seed0-e5")]
    out = tmp_path / "curves.png"
    assert cli_main(["plot", *runs, "--out", str(out)]) == 0
    png = out.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000, len(png)
    assert cli_main(["plot", *runs, "--out", str(tmp_path / "again.png")]) == 0
    assert (tmp_path / "again.png").read_bytes() == png
    capsys.readouterr()
    assert cli_main(["plot", str(tmp_path), "--out", str(tmp_path / "x.png")]) == 2
    assert f"{tmp_path} is not a recorded run: it has no history.json" in capsys.readouterr().err
    assert cli_main(["plot", *runs, "--out", str(tmp_path / "x.jpg")]) == 2
    assert "the file's suffix must be one of .png, .pdf" in capsys.readouterr().err


def test_a_figure_is_written_whole_or_not_at_all(tmp_path):
    """figures.save writes each format through a temporary file renamed over the old one: a render
    that fails half-way leaves the previous figure as it was, and no temporary file."""
    import matplotlib.pyplot as plt

    from petra_core.report import figures

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    old = figures.save(fig, tmp_path, "curve")
    before = {p.name: p.read_bytes() for p in old}

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])

    def fails_half_way(f, **kw):
        f.write(b"%PDF-half")
        raise OSError(28, "No space left on device")

    fig.savefig = fails_half_way
    with pytest.raises(OSError, match="No space left"):
        figures.save(fig, tmp_path, "curve")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


# --- language-model studies: PETRA on reversible transformers, ACCO on a language model --------------
TF_PROFILE = {
    "profile": "faketf",
    "run_name": "{arch}-{method}-seed{seed}-e{epochs}",
    "train": {"dataset": "shakespeare", "size": "cpu", "batch_size": 12, "windows_per_epoch": 1200, "eval_every": 1},
    "grid": [
        {"arch": "revgpt", "method": ["backprop", "petra"], "seed": [0, 1], "epochs": [2, 4]},
        {"arch": "gpt", "method": "backprop", "seed": [0, 1], "epochs": [2, 4]},
        {"arch": "revgpt", "method": "petra", "rebuild_span": 1, "seed": [0, 1], "epochs": [2, 4],
         "run_name": "{arch}-{method}-span{rebuild_span}-seed{seed}-e{epochs}"},
    ],
}  # fmt: skip
TF_LOSS = {  # at 2 epochs
    ("revgpt", "backprop", 0): 2.0,
    ("revgpt", "petra", 0): 2.3,
    ("gpt", "backprop", 0): 1.95,
    ("revgpt", "petra", 1): 2.2,
}


def text_history(loss_at: callable, epochs: int, images_per_s: float = 100.0) -> list[dict]:
    return [
        {
            "epoch": e,
            "train_loss": loss_at(e) - 0.05,
            "train_bpc": 1.0,
            "train_ppl": 1.0,
            "train_acc": 40.0,
            "test_loss": loss_at(e),
            "test_bpc": loss_at(e) / math.log(2),
            "test_ppl": math.exp(loss_at(e)),
            "test_acc": 40.0,
            "lr": 0.001,
            "images_per_s": images_per_s,
            "wall_time_s": 1.0,
            "eval_time_s": 0.1,
        }
        for e in range(1, epochs + 1)
    ]


def text_metrics(history: list[dict], steps: int, kept: list[int], **extra) -> dict:
    last = history[-1]
    return {
        **{
            k: last[k]
            for k in ("test_loss", "test_bpc", "test_ppl", "test_acc", "train_loss", "train_bpc", "train_ppl")
        },
        "train_acc": 40.0,
        "best_test_loss": min(h["test_loss"] for h in history),
        "epochs": len(history),
        "optimizer_steps": steps,
        "peak_kept_bytes": kept,
        "images_per_s": history[-1]["images_per_s"],
        "wall_time_s": 1.0,
        "params": 1000,
        "aux_params": 0,
        "stages": len(kept),
        "stage_kinds": "S R R H",
        **extra,
    }


def write_tf_run(run_dir, cfg):
    # the loss halves its distance to 1.5 with every doubling of the budget, PETRA's gap with it
    span = cfg.get("rebuild_span", 0)
    base = TF_LOSS[cfg["arch"], cfg["method"], span] - 0.25 * (cfg["epochs"] == 4) + 0.01 * cfg["seed"]
    history = text_history(lambda e: base + 0.1 * (cfg["epochs"] - e), cfg["epochs"])
    kept = [1_000_000] * 4 if cfg["method"] == "backprop" else [250_000 + 250_000 * span] * 4
    write_records(run_dir, cfg, text_metrics(history, 100 * cfg["epochs"], kept), history)


@pytest.fixture(scope="module")
def tf_runs(tmp_path_factory):
    return profile_results(tmp_path_factory, TF_PROFILE, write_tf_run)


def test_the_transformer_study_tables_the_gap_to_backprop_per_budget_and_the_twins_cost(tf_runs):
    from petra_core.report.tables import render
    from petra_core.report.transformers import budget_frame, goals, transformers_context, transformers_figure

    frame = budget_frame(tf_runs["summary"], tf_runs["results"]).set_index(["arch", "method", "span", "minibatches"])
    assert frame.loc[("revgpt", "petra", 0, 200), "gap"] == pytest.approx(0.3)
    assert frame.loc[("revgpt", "petra", 1, 200), "gap"] == pytest.approx(0.2)  # bounded rebuild chains
    assert frame.loc[("gpt", "backprop", 0, 400), "gap"] == pytest.approx(-0.05)  # the cost of reversibility
    assert frame.loc[("revgpt", "petra", 0, 400), "mean"] == pytest.approx(2.055)  # seeds 0 and 1
    assert set(frame.metric) == {"test_loss"}
    backprop, petra, bounded = goals(budget_frame(tf_runs["summary"], tf_runs["results"]))
    assert backprop["value"] == pytest.approx(1.755) and backprop["met"]  # the best within 5,000 steps
    assert petra["value"] == pytest.approx(0.3) and not petra["met"]  # at the largest budget, 400
    assert bounded["value"] == pytest.approx(0.2) and "PETRA (rebuild span 1)'s gap" in bounded["what"]
    context = transformers_context(tf_runs, "faketf")
    md = render("transformers", "md", context)
    assert "| 400 | 1.755 ± 0.007 (n = 2) | – | 2.055 ± 0.007 (n = 2) | +0.300 ± 0.010 |" in md, md
    assert "| RevGPT, PETRA (rebuild span 1) |" in md and "+0.200 ± 0.010 |" in md, md
    assert "PETRA's gap to backprop at 400 minibatches: 0.300 ± 0.010 (goal ≤ 0.05): **not met**" in md
    assert "| RevGPT, PETRA | 4 | 1,000 | 1.00 | 0.25 |" in md  # kept bytes of the run, MB
    assert "| RevGPT, PETRA (rebuild span 1) | 4 | 1,000 | 2.00 | 0.50 |" in md
    assert "\\begin{tabular}" in render("transformers", "tex", context)
    fig = transformers_figure(tf_runs, "faketf")
    assert fig.axes[0].get_xscale() == "log" and fig.axes[1].get_ylabel() == "validation loss (nats/char)"
    # a line's colour is its setting's, its style its method's: PETRA dashed, backprop solid, the twin's squares
    lines = {c.get_label(): c.lines[0] for c in fig.axes[0].containers}
    assert lines["RevGPT, PETRA"].get_linestyle() == "--" and lines["RevGPT, Backprop"].get_linestyle() == "-"
    assert lines["GPT, Backprop"].get_marker() == "s" and lines["RevGPT, PETRA"].get_marker() == "o"
    assert len({tuple(line.get_color()) if not isinstance(line.get_color(), str) else line.get_color()
                for line in lines.values()}) == len(lines)  # fmt: skip


def test_the_revvit_goal_asks_whether_petras_top1_gap_shrinks_with_budget():
    import pandas as pd

    from petra_core.report.transformers import goals

    def frame(gaps):
        rows = [
            dict(model="revvit", metric="top1", arch="revvit", method=m, k=1, span=0, decay="step", predict=0.0,
                 blocks=1, lr=0.0, minibatches=mb, mean=50.0,
                 std=0.5, gap=gap if m == "petra" else float("nan"), gap_err=0.7 if m == "petra" else float("nan"))
            for mb, gap in gaps.items()
            for m in ("backprop", "petra")
        ]  # fmt: skip
        return pd.DataFrame(rows)

    (shrinks,) = goals(frame({250: -6.0, 500: -4.0, 1000: -2.5}))
    assert shrinks["value"] == -2.5 and shrinks["met"] and "smaller in size than its -6.000 at 250" in shrinks["target"]
    (grows,) = goals(frame({250: -2.0, 1000: -3.0}))
    assert not grows["met"]
    assert goals(frame({1000: -3.0})) == []  # one budget: nothing to ask


def test_a_recipe_variants_gap_is_against_backprop_under_the_same_decay():
    """Runs under cosine decay (and PETRA with weight prediction, or with 2 blocks a stage, or at
    another lr than the study's) form their own settings: PETRA's gap is against backprop with the
    same decay and lr (and a stage per block), and the goal is asked of each setting."""
    import pandas as pd

    from petra_core.report.transformers import STUDY_LR, budget_frame, goals

    def row(method, seed_mean, decay, predict=0.0, span=0, per_stage=1, lr=STUDY_LR):
        return dict(profile="t", dataset="shakespeare", arch="revgpt", width=float("nan"), method=method, k=1,
                    rebuild_span=span, lr_decay=decay, weight_prediction=predict, blocks_per_stage=per_stage,
                    base_lr=lr, epochs=20, n=2,
                    test_loss_mean=seed_mean, test_loss_std=0.01, test_bpc_mean=seed_mean / 0.693)  # fmt: skip

    summary = pd.DataFrame(
        [
            row("backprop", 1.74, "step"),
            row("petra", 2.17, "step", span=1),
            row("backprop", 1.73, "cosine"),
            row("petra", 1.80, "cosine", predict=1.0, span=1),
            row("petra", 1.78, "step", per_stage=2),
            row("backprop", 1.90, "step", lr=1e-4),
            row("petra", 1.93, "step", lr=1e-4),
        ]
    )
    results = summary.assign(optimizer_steps=5000, fidelity_every=0)[["arch", "dataset", "epochs", "k",
                                                                      "optimizer_steps", "fidelity_every"]]  # fmt: skip
    frame = budget_frame(summary, results)
    gaps = {(r.decay, r.predict, r.blocks, r.lr): round(r.gap, 3) for r in frame.itertuples() if r.method == "petra"}
    assert gaps == {
        ("step", 0.0, 1, 0.0): 0.43,
        ("cosine", 1.0, 1, 0.0): 0.07,
        ("step", 0.0, 2, 0.0): 0.04,
        ("step", 0.0, 1, 1e-4): 0.03,  # against backprop at lr 1e-4
    }
    found = {g["what"]: g["met"] for g in goals(frame)}
    assert found == {
        "RevGPT backprop (cosine decay), validation loss (nats/char) within 5,000 steps": True,  # the best, named
        "RevGPT PETRA (rebuild span 1)'s gap to backprop at 5,000 minibatches": False,
        "RevGPT PETRA (2 blocks a stage)'s gap to backprop at 5,000 minibatches": True,
        "RevGPT PETRA (rebuild span 1, cosine decay, weight prediction 1)'s gap to backprop at 5,000 "
        "minibatches": False,
        "RevGPT PETRA (lr 0.0001)'s gap to backprop at 5,000 minibatches": True,
    }
    profile = yaml.safe_load((ROOT / "workflow/config/profiles/transformers.yaml").read_text())
    assert profile["train"]["base_lr"] == STUDY_LR  # the study's lr, which a setting's label leaves out


ACCO_LM_PROFILE = {
    "profile": "fakeaccolm",
    "run_name": "{replica_rule}-seed{seed}",
    "train": {
        "dataset": "shakespeare",
        "arch": "revgpt",
        "size": "cpu",
        "batch_size": 12,
        "k": 2,
        "windows_per_epoch": 960,
        "epochs": 10,
        "replicas": 4,
        "optimizer": "adamw",
        "method": "backprop",
        "eval_every": 2,
    },
    "grid": [{"replica_rule": ["zero1", "dpu", "acco"], "seed": [0, 1]}],
}
ACCO_LM_LOSS = {"zero1": 2.0, "acco": 2.01, "dpu": 2.4}


def write_acco_lm_run(run_dir, cfg):
    base = ACCO_LM_LOSS[cfg["replica_rule"]] + 0.01 * cfg["seed"]
    history = text_history(lambda e: base / e, 10, images_per_s=240.0)  # 0.1 s a step of 2 x 12 windows
    for h in history[::2]:  # evaluated every 2 epochs
        h.update(test_loss=None, test_bpc=None, test_ppl=None, test_acc=None)
    metrics = text_metrics([h for h in history if h["test_loss"] is not None], 200, [0] * 4)
    metrics.update(epochs=10, train_loss=history[-1]["train_loss"], floats_sent_per_step=1.0)
    write_records(run_dir, cfg, metrics, history)


@pytest.fixture(scope="module")
def acco_lm_runs(tmp_path_factory):
    return profile_results(tmp_path_factory, ACCO_LM_PROFILE, write_acco_lm_run)


def test_acco_on_a_language_model_is_judged_on_validation_loss_and_clocked_on_a_link(acco_lm_runs):
    """A language model's rules are compared on validation loss (nats/char, lower is better); the
    clock models each rule's step on the declared link from the runs' measured compute."""
    from petra_core.plan.cluster import Link
    from petra_core.plan.replica_clock import step_seconds
    from petra_core.report.acco import acco_context, acco_figure, acco_frame, metric_of, verdicts
    from petra_core.report.tables import render

    assert metric_of(acco_lm_runs["results"]) == "test_loss"
    frame = acco_frame(acco_lm_runs["results"], acco_lm_runs["history"]).set_index("label")
    assert frame.loc["DPU, no warm-up", "early_test_loss"] == pytest.approx((2.4 + 2.41) / 2 / 2)  # epoch 2
    assert frame.loc["ACCO", "gap_test_loss"] == pytest.approx(0.001)
    (v,) = verdicts(acco_frame(acco_lm_runs["results"], acco_lm_runs["history"]))
    assert v["metric"] == "test_loss" and v["acco_level"] and v["claim_holds"]
    links = [
        {"name": "a slow link", "class": "ethernet", "latency_us": 100, "bandwidth_gb_s": 1e-5},
        {"name": "a fast link", "class": "nvlink", "latency_us": 1, "bandwidth_gb_s": 100},
    ]
    context = acco_context(acco_lm_runs, "fakeaccolm", links=links)
    clock = {r["label"]: r["links"] for r in context["clock"]["rows"]}
    assert context["clock"]["compute_s"] == pytest.approx(0.1)  # 2 x 12 windows at 240 a second
    slow = Link("ethernet", 1e-4, 1e4)  # 10 kB/s: a round of 1,000 floats takes 0.6 s, 6 steps' compute
    assert clock["DDP (ZeRO-1)"][0]["step_s"] == pytest.approx(
        step_seconds("zero1", compute_s=0.1, params=1000, replicas=4, link=slow)
    )
    assert clock["ACCO"][0]["total_h"] == pytest.approx(200 * clock["ACCO"][0]["step_s"] / 3600)
    assert clock["ACCO"][1]["step_s"] == pytest.approx(0.1)  # a fast link: the two rounds are hidden
    slow_summary, fast_summary = context["clock"]["summary"]
    assert fast_summary["acco_vs_ddp"] < 1 and slow_summary["acco_vs_ddp"] > 1  # 2 rounds on a slow link
    md = render("acco_lm", "md", context)
    assert "Training and validation loss (nats per character)" in md and "validation loss, end" in md, md
    assert "**Modelled wall-clock.**" in md and "| Rule | step on a slow link (s) | whole run (h) |" in md, md
    assert "- On a fast link, against DDP's whole run: DPU, no warm-up " in md
    assert "early validation loss" in md and "The claim holds." in md
    assert "validation loss (nats per character)" in render("acco_lm", "tex", context)
    fig = acco_figure(acco_lm_runs, "fakeaccolm", links=links)
    assert len(fig.axes) == 4 and fig.axes[2].get_xlabel() == "modelled wall-clock on a slow link (h)"


def test_the_drift_table_reads_each_stages_handed_down_input_and_cosine_from_the_fidelity_log():
    from petra_core.report.transformers import drift_rows

    rows = [
        dict(arch="revgpt", method="petra", k=1, rebuild_span=span, step=step, stage=j, kind=kind,
             input_error=err * (1 + span * (j == 1)), cosine=0.5 + 0.1 * j)
        for span in (0, 1)
        for step in (0, 25, 50, 75)
        for j, kind, err in ((0, "S", float("nan")), (1, "R", step / 10), (2, "H", 0.0))
    ]  # fmt: skip
    petra, bounded = drift_rows(pd.DataFrame(rows))
    assert petra["setting"] == "RevGPT, PETRA" and bounded["setting"] == "RevGPT, PETRA (rebuild span 1)"
    assert petra["steps"] == "50–75"  # the second half of the tracked steps
    stem, block, head = petra["stages"]
    assert stem["error"] is None and block["error"] == pytest.approx(6.25) and head["error"] == 0.0
    assert bounded["stages"][1]["error"] == pytest.approx(12.5) and block["cosine"] == pytest.approx(0.6)
    assert drift_rows(pd.DataFrame(rows).drop(columns="input_error")) == []  # a log from before the column


def test_the_delay_table_costs_each_setting_against_its_own_baseline_and_renders(tf_runs, tmp_path):
    """benchmarks/delay_sensitivity.py's rows: each costed against the row it names (same model and
    recipe without delay), none for a baseline; read by results.load from the results folder
    when present (empty when not), and rendered under the transformers study."""
    from petra_core.report import results as results_mod
    from petra_core.report.tables import render
    from petra_core.report.transformers import delay_rows, transformers_context

    rows = pd.DataFrame(
        [
            dict(setting="none", arch="revgpt", delays="0 0 0", question="no delay", baseline=float("nan"),
                 test_loss=2.2, minibatches=1250, git_revision="abcdef0123"),
            dict(setting="pipeline", arch="revgpt", delays="4 2 0", question="the pipeline's", baseline="none",
                 test_loss=2.5, minibatches=1250, git_revision="abcdef0123"),
            dict(setting="twin-none", arch="gpt", delays="0 0 0", question="twin", baseline="none",
                 test_loss=2.1, minibatches=1250, git_revision="abcdef0123"),
            dict(setting="twin-pipeline", arch="gpt", delays="4 2 0", question="twin delayed",
                 baseline="twin-none", test_loss=2.45, minibatches=1250, git_revision="abcdef0123"),
        ]
    )  # fmt: skip
    none, pipeline, twin, twin_delayed = delay_rows(rows)
    assert none["cost"] is None and pipeline["cost"] == pytest.approx(0.3)
    assert twin["cost"] == pytest.approx(-0.1) and twin_delayed["cost"] == pytest.approx(0.35)
    assert delay_rows(pd.DataFrame()) == []
    for name in (*results_mod.FRAMES, "summary"):
        pd.DataFrame({"run": ["a"]}).to_csv(tmp_path / f"{name}.csv", index=False)
    assert results_mod.load(tmp_path)["delays"].empty
    rows.to_csv(tmp_path / "delays.csv", index=False)
    assert list(results_mod.load(tmp_path)["delays"].setting) == ["none", "pipeline", "twin-none", "twin-pipeline"]
    md = render("transformers", "md", transformers_context({**tf_runs, "delays": rows}, "faketf"))
    assert "| the pipeline's | revgpt | 1,250, step | 4 2 0 | 2.500 | +0.300 | no delay |" in md, md
    assert "| no delay | revgpt | 1,250, step | 0 0 0 | 2.200 | – | – |" in md and "at abcdef0):" in md
    later = rows.assign(git_revision=["abcdef0123", "abcdef0123", "1234567890", "abcdef0123"])
    md = render("transformers", "md", transformers_context({**tf_runs, "delays": later}, "faketf"))
    assert "at abcdef0, 1234567):" in md  # every revision the rows were measured at
    assert not any(d["other_recipe"] for d in delay_rows(rows))
    slower = rows.assign(lr=[1e-3, 1e-3, 3e-4, 3e-4])  # the twin's rows at another lr: the twin-none row differs
    assert [d["other_recipe"] for d in delay_rows(slower)] == [False, False, True, False]
    # rows from before the schedule column are the study's steps; a cosine row is its own recipe
    cosine = pd.concat(
        [rows, pd.DataFrame([dict(setting="cosine-none", arch="revgpt", delays="0 0 0", question="cosine",
                                  baseline="none", test_loss=1.7, minibatches=5000, schedule="cosine",
                                  git_revision="abcdef0123")])],
        ignore_index=True,
    )  # fmt: skip
    cells = delay_rows(cosine)
    assert [d["schedule"] for d in cells] == ["step"] * 4 + ["cosine"]
    assert [d["other_recipe"] for d in cells] == [False] * 4 + [True]
    md = render("transformers", "md", transformers_context({**tf_runs, "delays": cosine}, "faketf"))
    assert "| cosine | revgpt | 5,000, cosine | 0 0 0 | 1.700 | -0.500 | no delay |" in md, md
    # an image model's rows are costed in top-1, in a table of their own after the language model's
    vit = pd.concat(
        [cosine, pd.DataFrame([
            dict(setting="vit-none", arch="revvit", delays="0 0 0 0", question="vit no delay", baseline="",
                 test_loss=1.5, top1=46.0, metric="top1", minibatches=1000, git_revision="fedcba9876"),
            dict(setting="vit-pipeline", arch="revvit", delays="6 4 2 0", question="vit delayed", baseline="vit-none",
                 test_loss=1.9, top1=28.5, metric="top1", minibatches=1000, git_revision="fedcba9876"),
        ])],
        ignore_index=True,
    )  # fmt: skip
    cells = delay_rows(vit)
    assert [d["metric"] for d in cells] == ["test_loss"] * 5 + ["top1"] * 2  # older rows: validation loss
    assert cells[-1]["value"] == 28.5 and cells[-1]["cost"] == pytest.approx(-17.5)
    tables = transformers_context({**tf_runs, "delays": vit}, "faketf")["delays"]
    assert [(t["metric"], len(t["rows"]), t["revisions"]) for t in tables] == [
        ("validation loss (nats/char)", 5, ["abcdef0"]),
        ("top-1 (%)", 2, ["fedcba9"]),
    ]
    md = render("transformers", "md", transformers_context({**tf_runs, "delays": vit}, "faketf"))
    assert "| vit delayed | revvit | 1,000, step | 6 4 2 0 | 28.50 | -17.50 | vit no delay |" in md, md
    assert "**Which stage's delay costs what, RevViT**" in md and "| top-1 (%) | cost | against |" in md


def test_the_delay_summary_names_the_cheapest_and_dearest_recipe_and_each_recipes_cost_by_budget(tf_runs):
    """Under a model's delay table, from its rows: at the budget most rows ran, the least and the most
    the pipeline's delays cost over the recipes tried (against each one's own no-delay row), and for
    a recipe measured at several budgets, the cost at each and whether it shrinks."""
    from petra_core.report.tables import render
    from petra_core.report.transformers import delay_rows, delay_summary, transformers_context

    pipe, none = "4 2 0", "0 0 0"

    def row(setting, delays, top1, baseline="", minibatches=1000, **recipe):
        return dict(setting=setting, arch="revvit", delays=delays, question=setting, baseline=baseline, top1=top1,
                    metric="top1", minibatches=minibatches, git_revision="fedcba9876", **recipe)  # fmt: skip

    rows = pd.DataFrame(
        [
            row("none", none, 46.0),
            row("pipeline", pipe, 29.0, "none"),
            row("none-slow", none, 35.0, "none", lr=1e-4),
            row("slow", pipe, 31.0, "none-slow", lr=1e-4),
            row("none-slow-250", none, 20.0, minibatches=250, lr=1e-4),
            row("slow-250", pipe, 15.0, "none-slow-250", minibatches=250, lr=1e-4),
            row("none-slow-4000", none, 50.0, minibatches=4000, lr=1e-4),
            row("slow-4000", pipe, 48.0, "none-slow-4000", minibatches=4000, lr=1e-4),
            row("sgd-none", none, 40.0, "none", lr=0.1, optimizer="sgd"),
            row("sgd", pipe, 30.0, "sgd-none", lr=0.1, optimizer="sgd"),
            row("scaled", pipe, 32.0, "none"),  # another setting of the study's recipe at 1,000: no series
            row("uniform", "4 4 4", 20.0, "none"),  # other delays: not the pipeline's
        ]
    )
    summary = delay_summary(delay_rows(rows))
    assert summary["pipeline"] == pipe and summary["minibatches"] == 1000
    assert (summary["least"]["setting"], summary["least"]["cost"]) == ("slow", pytest.approx(-4.0))
    assert (summary["most"]["setting"], summary["most"]["cost"]) == ("pipeline", pytest.approx(-17.0))
    (slow,) = summary["trends"]  # the study's recipe has two settings at 1,000, SGD one budget
    assert slow["recipe"] == "adamw, lr 0.0001, step decay"
    assert [(p["minibatches"], p["cost"]) for p in slow["points"]] == [(250, -5.0), (1000, -4.0), (4000, -2.0)]
    assert slow["shrinks"]
    assert delay_summary([])["least"] is None
    md = render("transformers", "md", transformers_context({**tf_runs, "delays": rows}, "faketf"))
    assert (
        "At 1,000 minibatches the pipeline's delays (4 2 0) cost from -4.00 (slow, against none-slow) to -17.00" in md
    )
    assert "is -5.00 at 250, -4.00 at 1,000, -2.00 at 4,000 minibatches: it shrinks with the budget." in md, md


def test_a_delay_cost_that_grows_then_shrinks_is_said_to_turn_at_its_dearest_budget(tf_runs):
    """A recipe's cost that grows to a budget and shrinks past it turns there, even where the last
    is dearer than the first; one that shrinks or grows all along does not turn."""
    from petra_core.report.tables import render
    from petra_core.report.transformers import delay_rows, delay_summary, transformers_context

    def row(setting, delays, top1, baseline="", minibatches=1000, **recipe):
        return dict(setting=setting, arch="revvit", delays=delays, question=setting, baseline=baseline, top1=top1,
                    metric="top1", minibatches=minibatches, git_revision="fedcba9876", **recipe)  # fmt: skip

    def series(costs: dict, **recipe):
        out = []
        for n, cost in costs.items():
            none = f"none-{n}-{recipe}"
            out += [row(none, "0 0", 50.0, minibatches=n, **recipe),
                    row(f"late-{n}-{recipe}", "2 0", 50.0 + cost, none, minibatches=n, **recipe)]  # fmt: skip
        return out

    rows = pd.DataFrame(
        series({250: -3.0, 1000: -4.0, 4000: -9.0, 16000: -5.0}, lr=1e-4)
        + series({250: -5.0, 1000: -4.0, 4000: -2.0}, lr=3e-5)
        + series({250: -1.0, 1000: -2.0}, lr=1e-5)
    )
    turning, shrinking, growing = delay_summary(delay_rows(rows))["trends"]
    assert turning["turns"] and not turning["shrinks"]
    assert turning["peak"] == {"minibatches": 4000, "cost": pytest.approx(-9.0)}
    assert not shrinking["turns"] and shrinking["shrinks"] and shrinking["peak"]["minibatches"] == 250
    assert not growing["turns"] and not growing["shrinks"]
    md = render("transformers", "md", transformers_context({**tf_runs, "delays": rows}, "faketf"))
    assert (
        "-3.00 at 250, -4.00 at 1,000, -9.00 at 4,000, -5.00 at 16,000 minibatches: it does not shrink with the "
        "budget, but it turns: past its dearest, -9.00 at 4,000, it shrinks to -5.00 at 16,000." in md
    ), md


def test_a_per_stage_lr_over_the_delay_is_a_recipe_of_its_own():
    """A delay row whose stages step at lr / delay**p (the benchmark's ``delay_lr``) names it in its
    recipe and is another recipe than its baseline; rows from before the column have one lr."""
    from petra_core.report.transformers import delay_rows

    def row(setting, delays, top1, baseline="", **recipe):
        return dict(setting=setting, arch="revvit", delays=delays, question=setting, baseline=baseline, top1=top1,
                    metric="top1", minibatches=1000, git_revision="fedcba9876", **recipe)  # fmt: skip

    old = pd.DataFrame([row("none", "0 0 0", 46.0), row("pipeline", "4 2 0", 29.0, "none")])
    scaled = pd.DataFrame([row("delay-lr", "4 2 0", 32.0, "none", delay_lr=0.5)])
    cells = delay_rows(pd.concat([old, scaled], ignore_index=True))  # the old rows have no delay_lr: NaN
    assert [c["recipe"] for c in cells] == ["adamw, lr 0.001, step decay"] * 2 + [
        "adamw, lr 0.001, step decay, each stage's lr over its delay^0.5"
    ]
    assert [c["other_recipe"] for c in cells] == [False, False, True]
    assert cells[-1]["cost"] == pytest.approx(-14.0)


def test_another_adam_beta2_is_a_recipe_of_its_own_against_each_models_own():
    """A delay row with another beta2 than its model's recipe (nanoGPT's 0.99 for the GPTs, minREV's
    0.999 for the ViTs) names it and is another recipe than its baseline; rows from before the
    column are their model's recipe's."""
    from petra_core.report.transformers import delay_rows

    def row(setting, arch, top1, baseline="", **recipe):
        return dict(setting=setting, arch=arch, delays="4 2 0", question=setting, baseline=baseline, top1=top1,
                    metric="top1", minibatches=1000, git_revision="fedcba9876", **recipe)  # fmt: skip

    old = pd.DataFrame([row("vit", "revvit", 29.0), row("gpt", "revgpt", 30.0)])
    new = pd.DataFrame(
        [row("vit-0.999", "revvit", 28.0, "vit", beta2=0.999), row("vit-0.95", "revvit", 27.0, "vit", beta2=0.95)]
    )
    cells = delay_rows(pd.concat([old, new], ignore_index=True))
    assert [c["recipe"] for c in cells] == ["adamw, lr 0.001, step decay"] * 3 + [
        "adamw, lr 0.001, step decay, beta2 0.95"
    ]
    assert [c["other_recipe"] for c in cells] == [False, False, False, True]
    # a model with no recipe's beta2 and none in its row names none (no "beta2 nan")
    alien = delay_rows(pd.DataFrame([row("mlp", "mlp", 20.0)]))
    assert alien[0]["recipe"] == "adamw, lr 0.001, step decay"


def test_petras_gap_is_split_into_the_delays_share_and_its_own(tf_runs):
    from petra_core.report.tables import render
    from petra_core.report.transformers import transformers_context, where_the_gap_is

    rows = [
        ("revgpt", "petra", 1, 0, 100, 0.9),
        ("revgpt", "petra", 1, 0, 200, 0.8),
        ("revgpt", "delayed", 1, 0, 100, 0.5),
        ("revgpt", "delayed", 1, 0, 200, 0.3),
        ("revgpt", "petra", 4, 0, 200, 0.5),
        ("revgpt", "petra", 1, 1, 200, 0.45),
        ("gpt", "backprop", 1, 0, 200, -0.03),
    ]
    frame = pd.DataFrame(
        [
            {
                "model": "revgpt",
                "arch": a,
                "method": m,
                "k": k,
                "span": s,
                "minibatches": b,
                "gap": g,
                "metric": "test_loss",
                "decay": "step",
                "predict": 0.0,
                "blocks": 1,
                "lr": 0.0,
            }
            for a, m, k, s, b, g in rows
        ]
    )
    # Runs of another recipe (cosine decay, weight prediction, another lr) at a larger budget stay out
    # of the study's split and get their own, each under its recipe, after the study's.
    other_recipes = pd.concat(
        [
            frame.iloc[[1, 3]].assign(minibatches=400, decay="cosine"),
            frame.iloc[[1, 3]].assign(minibatches=400, predict=1.0),
            frame.iloc[[1, 3]].assign(minibatches=400, lr=1e-4, gap=[0.6, 0.5]),
        ]
    )
    splits = where_the_gap_is(pd.concat([other_recipes, frame], ignore_index=True))
    assert [(w["recipe"], w["minibatches"]) for w in splits] == [
        ("", 200),
        ("cosine decay", 400),
        ("weight prediction 1", 400),
        ("lr 0.0001", 400),
    ]
    assert (splits[3]["petra"], splits[3]["delay"]) == (0.6, 0.5) and splits[3]["larger_k"] == []
    context = {**transformers_context(tf_runs, "faketf"), "gap_split": splits}
    md = render("transformers", "md", context)
    assert "**Where PETRA's gap comes from** (RevGPT, 200 minibatches): of its +0.800" in md, md
    assert "**Where PETRA's gap comes from** (RevGPT, lr 0.0001, 400 minibatches): of its +0.600" in md
    (split,) = where_the_gap_is(frame)
    assert split["minibatches"] == 200  # the largest budget both ran
    assert (split["petra"], split["delay"]) == (0.8, 0.3) and split["rest"] == pytest.approx(0.5)
    assert split["larger_k"] == [{"k": 4, "gap": 0.5}] and split["bounded"] == [{"span": 1, "gap": 0.45}]
    assert split["current_weights"] is None  # no DSP run at that budget
    with_dsp = pd.concat([frame, frame.iloc[[3]].assign(method="dsp", gap=0.4)], ignore_index=True)
    (split,) = where_the_gap_is(with_dsp)
    assert split["current_weights"] == pytest.approx(0.1) and split["rebuilt_inputs"] == pytest.approx(0.4)
    assert where_the_gap_is(frame[frame.method != "delayed"]) == []
    split_by_two = frame.iloc[[1]].assign(blocks=2, gap=0.2)  # PETRA with 2 blocks a stage, at 200
    (split,) = where_the_gap_is(pd.concat([frame, split_by_two], ignore_index=True))
    assert split["fewer_stages"] == [{"blocks": 2, "gap": 0.2}] and split["petra"] == 0.8


def test_what_a_lower_lr_costs_backprop_is_set_beside_petras_gap(tf_runs):
    """Backprop at another peak lr against the study's, at each budget both ran, and PETRA's gap at
    the study's lr over the same budgets: whether each grows with the budget."""
    from petra_core.report.tables import render
    from petra_core.report.transformers import lower_lr_cost, transformers_context

    def row(method, lr, minibatches, mean, gap=float("nan"), **other):
        return {"model": "revvit", "arch": "revvit", "method": method, "k": 1, "span": 0, "decay": "step",
                "predict": 0.0, "blocks": 1, "lr": lr, "minibatches": minibatches, "metric": "top1",
                "mean": mean, "std": 0.5, "n": 2, "gap": gap, "gap_err": 0.7, **other}  # fmt: skip

    frame = pd.DataFrame(
        [
            row("backprop", 0.0, 250, 30.0),
            row("backprop", 0.0, 1000, 46.0),
            row("backprop", 0.0, 2000, 55.0),  # no lr-1e-4 run here: not a point
            row("backprop", 0.0, 4000, 63.0),
            row("backprop", 1e-4, 250, 25.0),
            row("backprop", 1e-4, 1000, 35.0),
            row("backprop", 1e-4, 4000, 50.0),
            row("petra", 0.0, 250, 20.0, gap=-10.0),
            row("petra", 0.0, 4000, 33.0, gap=-30.0),
            row("backprop", 1e-4, 1000, 30.0, decay="cosine"),  # another decay: left out
            row("backprop", 1e-4, 1000, 30.0, blocks=3),  # another split: left out
        ]
    )
    (cost,) = lower_lr_cost(frame)
    assert (cost["model"], cost["lr"], cost["unit"]) == ("RevViT", 1e-4, "points of top-1")
    assert [(p["minibatches"], p["cost"], p["petra_gap"]) for p in cost["points"]] == [
        (250, -5.0, -10.0),
        (1000, -11.0, None),
        (4000, -13.0, -30.0),
    ]
    assert cost["grows"] and cost["petra_grows"]
    assert cost["points"][0]["err"] == pytest.approx(0.5 * 2**0.5)
    shrinking = frame.assign(mean=[30.0, 46.0, 55.0, 63.0, 20.0, 40.0, 61.0, 20.0, 33.0, 30.0, 30.0])
    assert not lower_lr_cost(shrinking)[0]["grows"]
    assert lower_lr_cost(frame[frame.lr == 0]) == []  # no other lr: nothing to say
    context = {**transformers_context(tf_runs, "faketf"), "lower_lr": [cost]}
    md = render("transformers", "md", context)
    assert (
        "**What a lower lr costs backprop itself** (RevViT, lr 0.0001 against the study's, the same step decay): "
        "-5.000 ± 0.707 points of top-1 at 250, -11.000 ± 0.707 points of top-1 at 1,000, -13.000 ± 0.707 points "
        "of top-1 at 4,000 minibatches: it grows with the budget, as PETRA's gap at the study's lr grows "
        "(-10.000, -30.000)." in md
    ), md
