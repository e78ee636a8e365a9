"""The comparison scripts against the official codes (benchmarks/compare_official_*.py): what can be
checked without the official code (it is not shipped: licences, no network), and their committed
records under results/official/."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from petra_core import build_model

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "official"


def script(name: str):
    path = ROOT / "benchmarks" / f"compare_official_{name}.py"
    spec = importlib.util.spec_from_file_location(f"compare_official_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_directory_without_the_official_code_is_one_line_and_exit_2(tmp_path, capsys):
    petra = script("petra")
    with pytest.raises(SystemExit) as exit_:
        petra.main(["--official", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(tmp_path) in err and "stephane-rivaud/PETRA" in err and "main.py" in err


def test_every_petra_revnet18_parameter_is_set_from_an_official_one():
    """The name map covers each stage's parameters exactly (a renamed petra parameter fails here)."""
    petra = script("petra")
    model = build_model("revnet18", num_classes=10, width=64)
    for stage in model:
        assert set(petra.name_map(stage).values()) == {name for name, _ in stage.named_parameters()}


def test_the_official_conventions_make_the_runs_equal_and_petras_default_clock_does_not():
    record = json.loads((RESULTS / "petra_simulator.json").read_text())
    assert re.fullmatch(r"[0-9a-f]{40}", record["official_commit"])
    assert record["setup"]["warmup_clock"] == "call" and record["setup"]["calls"] >= 40
    assert record["match"] is True
    assert {r["method"] for r in record["methods"]} == {"backprop", "delayed", "dsp", "petra"}
    for r in record["methods"]:
        assert r["max_abs_loss_diff"] <= record["tolerance"] and r["max_abs_param_diff"] <= record["tolerance"]
        assert r["losses_compared"] == r["losses_official"] == r["losses_petra"] > 0
    step = json.loads((RESULTS / "petra_simulator_step_clock.json").read_text())
    assert step["setup"]["warmup_clock"] == "step" and step["match"] is False
    assert step["methods"][0]["first_minibatch_beyond_tolerance"] is not None  # the clock is what differs
