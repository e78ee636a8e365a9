"""The run's optional epoch loggers (history.csv, TensorBoard) and the progress bar in minibatches."""

import importlib.util
import json

import pandas as pd
import pytest
from conftest import TIMING, argv, tiny_run, whole_and_resumed

from petra_core.cli import main
from petra_core.methods.schedule import Pipelined
from petra_core.run.config import ConfigError, RunConfig
from petra_core.run.loggers import CSV_FILE, history_csv, scalar_tag
from petra_core.run.trainer import Progress

RUN = tiny_run(synthetic_train=32, synthetic_test=16, batch_size=8, epochs=3, eval_every=2)


def test_the_csv_has_a_row_per_epoch_and_leaves_a_missing_value_empty():
    history = [
        {"epoch": 1, "train_loss": 2.5, "top1": None, "lr": 0.1},
        {"epoch": 2, "train_loss": 2.0, "top1": 31.25, "lr": 0.05, "extra": {"nested": 1}},
    ]
    assert history_csv(history) == "epoch,train_loss,top1,lr\n1,2.5,,0.1\n2,2.0,31.25,0.05\n"


def test_logger_csv_writes_the_history_and_a_resumed_run_writes_the_same_file(tmp_path):
    config = argv({**RUN, "logger": "csv"})
    whole, cut = whole_and_resumed(config, tmp_path, signal_at="0:9:SIGINT")  # in epoch 2 of 3
    frames = [pd.read_csv(run / CSV_FILE).drop(columns=list(TIMING), errors="ignore") for run in (whole, cut)]
    assert list(frames[0]["epoch"]) == [1, 2, 3]
    pd.testing.assert_frame_equal(frames[0], frames[1])
    history = json.loads((whole / "history.json").read_text())
    assert (whole / CSV_FILE).read_text() == history_csv(history)  # a view of history.json, nothing else
    assert frames[0]["top1"].isna().tolist() == [True, False, False]  # evaluated at epochs 2 and 3


def test_without_a_logger_there_is_no_csv(tmp_path):
    assert main(["train", *argv({**RUN, "epochs": 1}), "--run-dir", str(tmp_path / "run")]) == 0
    assert not (tmp_path / "run" / CSV_FILE).exists()


def test_a_logger_is_how_a_run_is_watched_so_it_may_change_on_resume(tmp_path):
    assert main(["train", *argv({**RUN, "epochs": 1}), "--run-dir", str(tmp_path / "run")]) == 0
    assert main(["train", *argv({**RUN, "epochs": 1, "logger": "csv"}), "--run-dir", str(tmp_path / "run")]) == 0


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is not None, reason="tensorboard is installed")
def test_logger_tensorboard_without_the_package_is_one_line():
    with pytest.raises(ConfigError, match=r"^logger='tensorboard' needs the tensorboard package") as err:
        RunConfig.from_dict({**RUN, "logger": "tensorboard"})
    assert "\n" not in str(err.value)


def test_a_bad_logger_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match=r"logger='wandb'.*none, csv, tensorboard"):
        RunConfig.from_dict({**RUN, "logger": "wandb"})


def test_tensorboard_tags_group_train_and_test_curves():
    assert [scalar_tag(k) for k in ("train_loss", "test_loss", "top1", "lr")] == [
        "train/loss",
        "test/loss",
        "test/top1",
        "lr",
    ]


def test_tensorboard_events_hold_each_epoch_once_after_a_resume(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    whole, cut = whole_and_resumed(argv({**RUN, "logger": "tensorboard"}), tmp_path, signal_at="0:9:SIGINT")
    for run in (whole, cut):
        events = EventAccumulator(str(run / "tensorboard")).Reload()
        assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3]


def test_the_bar_counts_minibatches_whose_gradient_reached_stage_0():
    """Fill and drain ticks move it by nothing; it ends at epochs x minibatches, in the last epoch."""
    cfg = RunConfig.from_dict({**RUN, "epochs": 2})
    schedule = Pipelined(num_stages=4, num_batches=2 * 5)
    progress = Progress(schedule, 5, cfg, disable=True)
    counts = []
    for tick in range(schedule.num_ticks + 1):
        progress.to_tick(tick)
        counts.append(progress.done)
    assert counts[0] == 0 and counts[-1] == 10
    first = schedule.backward_tick(0, 0)
    assert counts[first] == 0 and counts[first + 1] == 1  # counted once its stage-0 backward has run
    assert progress.description.endswith("epoch 2/2")
