"""Nothing lost, nothing stale: divergence anywhere stops a run, JSON is strict, diagnostics
survive a resume, run files are readable by the group, errors say what to type.

(Rank failures named by every survivor: tests/test_distributed_train.py.)
"""

import json
import math
import os
import signal
import stat

import pandas as pd
import pytest
from conftest import argv, tiny_run

from petra_core.cli import main
from petra_core.data import DataError, prepare
from petra_core.run import runio
from petra_core.run.config import ConfigError, RunConfig
from petra_core.run.trainer import Diverged, Interrupted, train

RUN_4X16 = tiny_run(synthetic_train=64, synthetic_test=32, batch_size=16)  # 4 minibatches of 16 an epoch


def strict(path):
    """The JSON file, parsed as strict JSON (a bare NaN or Infinity is an error)."""

    def refuse(name):
        raise ValueError(f"{path} holds {name}")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_divergence_in_the_last_epoch_is_a_failure_not_a_result(tmp_path, capsys):
    """The issue's reproduction: base_lr=1e6 blows the weights up; the run must not report success."""
    run = tmp_path / "run"
    code = main(["train", *argv(RUN_4X16), "base_lr=1e6", "--run-dir", str(run)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3, err
    assert err[-1].startswith("petra: error: ") and "NaN or infinite" in err[-1] and "epoch 1" in err[-1], err
    assert "last good checkpoint: none" in err[-1]
    assert not (run / runio.METRICS).exists()
    for path in run.glob("*.json"):
        strict(path)


def test_a_non_finite_test_loss_stops_the_run_and_is_recorded_as_null(tmp_path, monkeypatch):
    import petra_core.run.trainer as trainer

    real = trainer.evaluate

    def broken_second_epoch(model, stream):
        out = real(model, stream)
        return {**out, "test_loss": float("nan")} if len(list((tmp_path / "run").glob("checkpoint.pt"))) else out

    monkeypatch.setattr(trainer, "evaluate", broken_second_epoch)
    with pytest.raises(Diverged, match=r"test loss is nan after epoch 2; stopped; last good checkpoint: .*\(epoch 1\)"):
        train(RunConfig.from_dict(RUN_4X16), tmp_path / "run", log=lambda m: None)
    history = strict(tmp_path / "run" / runio.HISTORY)
    assert history[1]["test_loss"] is None and history[1]["non_finite"] == {"test_loss": "nan"}
    assert len(runio.load_checkpoint(tmp_path / "run" / runio.CHECKPOINT)["history"]) == 1  # the good one
    assert not (tmp_path / "run" / runio.METRICS).exists()


def test_json_is_strict(tmp_path):
    runio.write_json(tmp_path / "m.json", {"a": float("nan"), "b": [1.5, float("inf")], "c": {"d": -math.inf}})
    data = strict(tmp_path / "m.json")
    assert data == {
        "a": None,
        "b": [1.5, None],
        "c": {"d": None, "non_finite": {"d": "-inf"}},
        "non_finite": {"a": "nan"},
    }


@pytest.mark.parametrize("tick", [5, 6, 13])  # inside a group of k=2, at its end, in the second epoch
def test_fidelity_tracking_survives_a_resume_at_any_tick(tmp_path, tick):
    cfg, ref = _interrupted_fidelity_run(tmp_path, tick)
    train(cfg, tmp_path / "run", log=lambda m: None)
    resumed = pd.read_csv(tmp_path / "run" / runio.FIDELITY)
    # the groups in flight at the checkpoint too: their inputs and rebuild errors travel in it
    pd.testing.assert_frame_equal(resumed, ref)
    assert ref.input_error.notna().all() and (ref.input_error > 0).any()  # some stages rebuild


def _interrupted_fidelity_run(tmp_path, tick):
    """The reference run's fidelity log, and a run of the same config stopped at ``tick``."""
    cfg = RunConfig.from_dict({**RUN_4X16, "k": 2, "fidelity_every": 1})
    train(cfg, tmp_path / "ref", log=lambda m: None)

    def interrupt(t):
        if t == tick:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(Interrupted):
        train(cfg, tmp_path / "run", on_tick=interrupt, log=lambda m: None)
    return cfg, pd.read_csv(tmp_path / "ref" / runio.FIDELITY)


def test_a_fidelity_log_lost_after_its_checkpoint_comes_back_whole(tmp_path):
    """Stopped between the checkpoint and the log's rewrite: the checkpoint holds the records."""
    cfg, ref = _interrupted_fidelity_run(tmp_path, 6)
    (tmp_path / "run" / runio.FIDELITY).unlink()
    train(cfg, tmp_path / "run", log=lambda m: None)
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "run" / runio.FIDELITY), ref)


def test_a_checkpoint_without_the_fidelity_state_resumes_from_the_log(tmp_path):
    """An older petra's checkpoint: the records come from the file, and only the rebuilt-input
    errors of the groups in flight at the checkpoint are unknown (NaN)."""
    import torch

    cfg, ref = _interrupted_fidelity_run(tmp_path, 5)
    path = tmp_path / "run" / runio.CHECKPOINT
    manifest = torch.load(path, weights_only=False)
    del manifest["observers"]
    torch.save(manifest, path)
    train(cfg, tmp_path / "run", log=lambda m: None)
    resumed = pd.read_csv(tmp_path / "run" / runio.FIDELITY)
    pd.testing.assert_frame_equal(resumed.drop(columns="input_error"), ref.drop(columns="input_error"))
    known = resumed.input_error.notna()
    assert 0.5 < known.mean() < 1 and (resumed.input_error[known] == ref.input_error[known]).all()


def test_run_files_get_the_mode_open_would_give_them(tmp_path):
    """Not mkstemp's private 0600: with the usual umask 022, readable by the group (a shared cluster)."""
    umask = os.umask(0)
    os.umask(umask)
    runio.write_text(tmp_path / "x.txt", "x")
    (tmp_path / "plain.txt").write_text("x")
    mode = stat.S_IMODE((tmp_path / "x.txt").stat().st_mode)
    assert mode == stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode) == 0o666 & ~umask
    if umask == 0o022:
        assert mode == 0o644


def test_errors_name_the_flag_and_give_an_example(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(DataError, match="petra prepare --overwrite"):
        prepare("synthetic", None, tmp_path / "out")
    with pytest.raises(ConfigError, match=r"expected list, e\.g\. milestones=\[150, 225\]"):
        RunConfig.from_dict({"milestones": 5})
    with pytest.raises(ConfigError, match=r"e\.g\. milestones=\[150, 225\]"):
        RunConfig.from_dict({"milestones": [0]})


# ---- files damaged on disk --------------------------------------------------------------------
def interrupt_at(ticks):
    def on_tick(tick):
        if tick in ticks:
            os.kill(os.getpid(), signal.SIGINT)

    return on_tick


def test_a_damaged_newest_checkpoint_resumes_from_the_previous_one_exactly(tmp_path, capsys):
    """A checkpoint is replaced only once its successor reads back; if the newest is damaged (a
    full disk, a partial copy), the run goes on from the one before, and ends with the same bits."""
    cfg = RunConfig.from_dict({**RUN_4X16, "epochs": 3})
    reference = train(cfg, tmp_path / "ref", log=lambda m: None)
    run = tmp_path / "run"
    with pytest.raises(Interrupted):
        train(cfg, run, on_tick=interrupt_at({6}), log=lambda m: None)  # checkpoint at tick 6 (epoch 1 ended)
    assert not (run / "checkpoint.previous.pt").exists()  # read back: the previous one is gone
    first = (run / "checkpoint.pt").read_bytes()
    with pytest.raises(Interrupted):
        train(cfg, run, on_tick=interrupt_at({9}), log=lambda m: None)
    (run / "checkpoint.previous.pt").write_bytes(first)  # as if the newest had not been read back yet
    newest = (run / "checkpoint.pt").read_bytes()
    (run / "checkpoint.pt").write_bytes(newest[: len(newest) // 2])  # truncated
    resumed = train(cfg, run, log=lambda m: None)
    err = capsys.readouterr().err
    assert f"{run / 'checkpoint.pt'} is damaged (" in err and "resuming from the previous checkpoint" in err
    drop = {"images_per_s", "wall_time_s", "eval_time_s", "bn_reestimate_time_s"}
    assert {k: v for k, v in resumed.items() if k not in drop} == {k: v for k, v in reference.items() if k not in drop}
    assert not (run / "checkpoint.previous.pt").exists()


def test_a_damaged_checkpoint_with_nothing_before_it_is_one_line(tmp_path, capsys):
    config = {**RUN_4X16, "epochs": 2}
    run = tmp_path / "run"
    with pytest.raises(Interrupted):
        train(RunConfig.from_dict(config), run, on_tick=interrupt_at({5}), log=lambda m: None)
    (run / "checkpoint.pt").write_bytes(b"not a checkpoint")
    assert main(["train", *argv(config), "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"petra: error: {run / 'checkpoint.pt'} is damaged (") and "\n" not in err
    assert "dvc pull" in err and "delete it to train the run from the start" in err


def test_a_damaged_run_record_is_named_in_one_line(tmp_path):
    from petra_core.run.runio import DamagedFile, read_json, read_yaml

    (tmp_path / "metrics.json").write_text('{"top1": 7')
    with pytest.raises(DamagedFile, match=r"metrics.json is damaged \(JSONDecodeError: .*\): .*git checkout --"):
        read_json(tmp_path / "metrics.json")
    (tmp_path / "config.yaml").write_text("arch: [revnet18\n")
    with pytest.raises(DamagedFile, match=r"config.yaml is damaged \(ScannerError|ParserError"):
        read_yaml(tmp_path / "config.yaml")
