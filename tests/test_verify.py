"""``petra verify`` (petra_core/run/verify.py): a record retrained at the current code, compared epoch
by epoch, with the judgement whether bit identity was to be expected."""

import json

import pytest
from conftest import tiny_run

from petra_core.cli import main
from petra_core.run.config import RunConfig
from petra_core.run.trainer import train
from petra_core.run.verify import compared, compared_line, differences, expectations

RUN = tiny_run(synthetic_train=96, synthetic_test=32, batch_size=16, bn_reestimate_batches=0)


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("record") / "run"
    train(RunConfig.from_dict(RUN), run_dir, log=lambda m: None)
    return run_dir


def test_a_record_retrained_at_the_same_code_is_bit_identical(record, tmp_path, capsys):
    assert main(["verify", str(record), "--epochs", "2", "--json", str(tmp_path / "report.json")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{record}: bit-identical over 2 epoch(s)")
    report = json.loads((tmp_path / "report.json").read_text())
    assert [r["epoch"] for r in report["compared"]] == [1, 2]  # what each epoch compared, text and JSON
    for row in report["compared"]:
        assert {"train_loss", "train_acc", "lr"} <= set(row["compared"]) and "images_per_s" not in row["compared"]
        assert f"  {compared_line(row)}" in out.splitlines()
    keys = {r["key"]: r["same"] for r in report["expectations"]}
    assert keys["torch"] and keys["cpu_capability"] and keys["torch_threads"]


def test_a_changed_setting_is_shown_key_by_key_and_not_expected_to_match(record, capsys):
    assert main(["verify", str(record), "--set", "base_lr=0.3"]) == 1
    out = capsys.readouterr().out
    assert "differs from its record over 1 epoch(s):" in out and "epoch 1 lr: record" in out
    assert "bit identity was not guaranteed" in out and "config: differs" in out


def test_stopping_after_some_epochs_writes_no_metrics(tmp_path):
    out = train(RunConfig.from_dict(RUN), tmp_path / "run", log=lambda m: None, until_epoch=1)
    assert len(out["history"]) == 1 and not (tmp_path / "run" / "metrics.json").exists()


def test_bad_arguments_are_one_line(record, tmp_path, capsys):
    assert main(["verify", str(record), "--epochs", "5"]) == 2
    assert "--epochs 5 is not allowed; the record has 2 epoch(s): 1..2" in capsys.readouterr().err
    assert main(["verify", str(tmp_path)]) == 2
    assert "is not a recorded run: it has no config.yaml" in capsys.readouterr().err


def test_what_decides_bit_identity_is_compared_field_by_field():
    here = {
        "git_revision": "abc",
        "torch": "2.1",
        "cpu_capability": "AVX512",
        "cpu_model": "EPYC",
        "torch_threads": 2,
        "device": "cpu",
    }
    rows = {
        r["key"]: r["same"]
        for r in expectations({**here, "torch_threads": 1, "git_revision": "abc-dirty", "cpu_model": None}, here)
    }
    assert rows == {
        "git_revision": False,
        "torch": True,
        "cpu_capability": True,
        "cpu_model": None,
        "torch_threads": False,
        "device": True,
    }
    cuda = {r["key"] for r in expectations({**here, "device": "cuda", "gpus": ["H200"]}, {**here, "device": "cuda"})}
    assert {"gpus", "cuda", "cudnn"} <= cuda
    a = [{"epoch": 1, "top1": 50.0, "wall_time_s": 3.0}]
    assert differences(a, [{"epoch": 1, "top1": 50.0, "wall_time_s": 9.0}], 1) == []
    assert differences(a, [{"epoch": 1, "top1": 49.5, "wall_time_s": 3.0}], 1) == [
        {"epoch": 1, "key": "top1", "record": 50.0, "here": 49.5, "difference": -0.5}
    ]


def test_an_epoch_without_test_evaluation_says_it_compared_training_quantities_only():
    """`petra verify` names what it compared: on an epoch the test set was not evaluated, both sides
    hold None for the test quantities, so "bit-identical" there covers training loss, accuracy and lr."""
    row = {"epoch": 1, "train_loss": 2.1, "train_acc": 18.5, "test_loss": None, "top1": None, "top5": None}
    evaluated = {**row, "epoch": 2, "test_loss": 1.9, "top1": 30.0, "top5": 80.0}
    recorded = [{**row, "lr": 0.01, "wall_time_s": 1.0}, {**evaluated, "lr": 0.02, "wall_time_s": 2.0}]
    now = [{**row, "lr": 0.01, "wall_time_s": 3.0}, {**evaluated, "lr": 0.02, "wall_time_s": 4.0}]
    first, second = compared(recorded, now, 2)
    assert compared_line(first) == "epoch 1: compared train_loss, train_acc, lr (no test evaluation this epoch)"
    assert compared_line(second) == "epoch 2: compared train_loss, train_acc, test_loss, top1, top5, lr"
    assert first["absent"] == ["test_loss", "top1", "top5"]
    only_once = [{**recorded[0], "extra": None}], [{**now[0], "extra": None}]
    assert compared_line(compared(*only_once, 1)[0]).endswith(
        "(no test evaluation this epoch; neither side holds extra)"
    )
