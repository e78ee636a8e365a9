"""``petra plan``: the commands run, and every bad input is one line and exit status 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from petra_core.cli import main
from petra_core.plan.profile import DeviceProfile, StageProfile, save_profile

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "results/gpu/nvidia-h200/stage_profile.json"


@pytest.fixture
def profile_path(tmp_path):
    s = StageProfile(0.01, 0.005, 0.02, 0.001, 4000, 4000, 4000, 1000, 2000, 2000, 3000)
    p = DeviceProfile("revnet18", "petra", 8, tuple(s for _ in range(10)), width=4, provenance={"source": "test"})
    return str(save_profile(p, tmp_path / "p.json"))


def run(capsys, *argv):
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_predict_from_a_profile(capsys, profile_path, tmp_path):
    code, out, _ = run(capsys, "predict", "--profile", profile_path, "--cluster", "h100-sxm-node",
                       "--stages", "10", "--epoch-minibatches", "100", "--json", str(tmp_path / "pr.json"))  # fmt: skip
    assert code == 0
    assert "petra: 10 stages on 8 device(s)" in out and "fits" in out and "epoch of 100 minibatches" in out
    record = json.loads((tmp_path / "pr.json").read_text())
    assert record["cluster"] == "h100-sxm-node" and record["seconds_per_minibatch"] > 0


def test_predict_from_the_h200_stage_profile(capsys):
    code, out, _ = run(capsys, "predict", "--profile", str(H200), "--method", "backprop", "--cluster",
                       "h200-sxm-node", "--split", "0-9")  # fmt: skip
    assert code == 0 and "backprop: 10 stages on 1 device(s)" in out


def test_search_commands(capsys, profile_path):
    assert run(capsys, "search", "split", "--profile", profile_path, "--devices", "3")[0] == 0
    code, out, _ = run(capsys, "search", "min-devices", "--profile", profile_path, "--memory-gib", "1")
    assert code == 0 and out.startswith("1 device(s)")
    code, out, _ = run(
        capsys, "search", "scan", "--profile", profile_path, "--max-devices", "12", "--cluster", "8x1-100gbe"
    )
    assert code == 0 and len(out.splitlines()) == 12
    code, _, err = run(
        capsys, "search", "scan", "--profile", profile_path, "--max-devices", "12", "--cluster", "cpu-box"
    )
    assert code == 2 and "no link between nodes" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["predict", "--cluster", "dgx-9"], "unknown cluster 'dgx-9'"),
        (["predict", "--split", "0-3,5-9"], "does not cover the model's 10 stages"),
        (["predict", "--model", "revnet50"], "is of model 'revnet18', not 'revnet50'"),
        (["predict", "--stages", "4"], "has 10 stages, the plan asks for 4"),
        (["predict", "--method", "delayed"], "times method 'petra', not 'delayed'"),
        (["predict", "--batch", "64"], "profile is at batch 8"),
        (["search", "min-devices", "--memory-gib", "0.00001"], "below stage 0's weights"),
        (["validate", "--bandwidths", "fast"], "--bandwidths 'fast': allowed: numbers"),
        (["validate", "--phase-ms", "warp=3"], "unknown phase 'warp'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, profile_path, argv, message):
    if argv[0] != "validate":
        argv = [*argv, "--profile", profile_path]
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


def test_unknown_link_in_a_card_file(capsys, profile_path, tmp_path):
    card = tmp_path / "card.yaml"
    card.write_text("name: x\ndevice: {name: X, memory_gib: 8}\nnodes: 1\ndevices_per_node: 2\n"
                    "links: {warp: {latency_us: 1, bandwidth_gb_s: 1}}\nintra_node: warp\n")  # fmt: skip
    code, _, err = run(capsys, "predict", "--profile", profile_path, "--cluster", str(card))
    assert code == 2 and "unknown link class 'warp'" in err


def test_plan_help_starts_without_torch():
    code = "import sys; from petra_core.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_profile_measures_on_this_machine(capsys, tmp_path):
    out = tmp_path / "p.json"
    code, printed, _ = run(capsys, "profile", "--model", "revnet18", "--method", "petra", "--batch", "2", "--width",
                           "4", "--minibatches", "4", "--out", str(out))  # fmt: skip
    assert code == 0 and str(out) in printed
    from petra_core.plan.profile import load_profile

    p = load_profile(out)
    assert (
        p.num_stages == 10 and p.provenance["source"] == "measured" and "petra plan profile" in p.provenance["command"]
    )
    assert all(s.forward_s > 0 and s.backward_s > 0 for s in p.stages)
    assert p.stages[0].kept_bytes == 2 * 3 * 32 * 32 * 4  # PETRA's stem keeps its input (the images)
    assert all(s.kept_bytes == 0 for s in p.stages[1:3])  # reversible stages keep nothing
    activation = p.stages[0].forward_message_bytes - 2 * 8  # the activation, then the labels (int64)
    assert p.stages[1].backward_message_bytes == activation  # a gradient to the stem, which keeps its input
    assert p.stages[2].backward_message_bytes == 2 * activation  # gradient + output: stage 1 rebuilds its input


def test_an_unknown_device_is_one_line(capsys, tmp_path):
    code, _, err = run(capsys, "profile", "--device", "tpu", "--out", str(tmp_path / "p.json"))
    assert code == 2 and "unknown device 'tpu'; allowed: cpu, cuda, cuda:N" in err
