"""End-to-end runs: learning, exact resume after a signal, determinism, and clear failures."""

import json
import os
import signal
import tarfile

import pytest
import torch
from conftest import argv, tiny_run, untimed

from petra_core.cli import main
from petra_core.run import runio
from petra_core.run.config import RunConfig
from petra_core.run.trainer import Interrupted, train

# 8 minibatches of 32 an epoch; the learning rate warms up over the first
RUN_8X32 = tiny_run(synthetic_train=256, synthetic_test=128, batch_size=32, base_lr=0.1, warmup_epochs=1.0)


def cfg(**kw):
    return RunConfig.from_dict({**RUN_8X32, **kw})


def final_state(run_dir):
    return runio.load_checkpoint(run_dir / runio.CHECKPOINT)["model"]


@pytest.mark.slow
def test_petra_learns_the_synthetic_task(tmp_path):
    config = cfg(width=8, synthetic_train=1024, synthetic_test=256, batch_size=16, k=4, epochs=4, base_lr=0.05)
    metrics = train(config, tmp_path / "run", log=lambda m: None)
    assert metrics["top1"] > 50, metrics  # chance is 10 %
    files = {p.name for p in (tmp_path / "run").iterdir()}
    assert {"config.yaml", "env.json", "history.json", "metrics.json", "checkpoint.pt"} <= files
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3, 4]
    assert set(history[0]) >= {
        "train_loss",
        "train_acc",
        "test_loss",
        "top1",
        "top5",
        "lr",
        "images_per_s",
        "wall_time_s",
    }
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert env["torch"] == torch.__version__ and env["device"] == "cpu" and env["torch_threads"] == 1


@pytest.mark.parametrize("method", ["petra", "delayed", "backprop"])
def test_interrupted_run_resumes_bit_for_bit(tmp_path, method):
    config = cfg(method=method, k=2)
    reference = train(config, tmp_path / "ref", log=lambda m: None)

    def interrupt(tick):
        if tick == 11:  # mid-epoch: the pipeline holds activations, gradients, buffers, stashes
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(Interrupted, match="SIGINT at tick 11"):
        train(config, tmp_path / "resumed", on_tick=interrupt, log=lambda m: None)
    assert not (tmp_path / "resumed" / "metrics.json").exists()
    messages = []
    resumed = train(config, tmp_path / "resumed", log=messages.append)
    assert "resuming at tick 11" in messages[0]
    assert untimed([resumed]) == untimed([reference])
    history = [json.loads((tmp_path / d / "history.json").read_text()) for d in ("ref", "resumed")]
    assert untimed(history[0]) == untimed(history[1])
    a, b = final_state(tmp_path / "ref"), final_state(tmp_path / "resumed")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_same_config_same_numbers(tmp_path):
    first = train(cfg(epochs=1), tmp_path / "a", log=lambda m: None)
    second = train(cfg(epochs=1), tmp_path / "b", log=lambda m: None)
    assert untimed([first]) == untimed([second])
    a, b = final_state(tmp_path / "a"), final_state(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_finished_run_is_not_retrained(tmp_path):
    train(cfg(epochs=1), tmp_path / "a", log=lambda m: None)
    said = []
    train(cfg(epochs=1), tmp_path / "a", log=said.append)
    assert said == [f"{tmp_path / 'a'}: already finished"]


def test_diverged_run_stops_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    # learning rate multiplied by 1e30 after epoch 1: the loss blows up during epoch 2
    code = main(["train", *argv(RUN_8X32), "method=backprop", "milestones=[1]", "gamma=1e30", "--run-dir", str(run)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3
    assert err[-1].startswith("petra: error: training loss is") and "(epoch 2," in err[-1]
    assert "last good checkpoint" in err[-1] and "(epoch 1)" in err[-1]
    assert len(runio.load_checkpoint(run / "checkpoint.pt")["history"]) == 1
    assert not (run / "metrics.json").exists()


def run_cli(capsys, *args):
    code = main(list(args))
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["bogus=1"], "unknown config key 'bogus'; allowed:"),
        (["epochs=two"], "epochs='two' has the wrong type; expected int"),
        (["method=sgd"], "method='sgd' is not allowed; allowed: backprop"),
        (["method=backprop", "phases=static"], "phases='static' runs methods whose stages keep their input"),
        (["method=petra", "phases=graphs"], "phases='graphs' captures CUDA graphs, and the stages are on cpu"),
        (["phases=fast"], "phases='fast' is not allowed; allowed: eager, static, graphs"),
        (["dataset=cifar10", "data_source=/nonexistent/cifar.tar.gz"], "/nonexistent/cifar.tar.gz"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, needle):
    run = tmp_path / "run"
    code, err = run_cli(
        capsys, "train", "progress=false", f"data_dir={tmp_path / 'prepared'}", *args, "--run-dir", str(run)
    )
    assert code == 2 and len(err) == 1 and err[0].startswith("petra: error:") and needle in err[0], err
    assert not run.exists()


def test_corrupt_archive_and_checksum_mismatch(tmp_path, capsys):
    src = tmp_path / "images"
    for split in ("train", "test"):
        for c in ("a", "b"):
            (src / split / c).mkdir(parents=True)
            from PIL import Image

            for i in range(2):
                Image.new("RGB", (32, 32), (i * 50, 10, 200)).save(src / split / c / f"{i}.png")
    archive = tmp_path / "cifar.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname=".")
    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    prepared = tmp_path / "prepared"
    code, err = run_cli(
        capsys,
        "train",
        "dataset=cifar10",
        f"data_source={truncated}",
        f"data_dir={prepared}",
        "progress=false",
        "--run-dir",
        str(tmp_path / "run"),
    )
    assert code == 2 and len(err) == 1 and "truncated.tar.gz" in err[0], err
    assert not (prepared / "cifar10").exists() and not (tmp_path / "run").exists()

    code, _ = run_cli(capsys, "prepare", "cifar10", "--source", str(archive), "--out", str(prepared / "cifar10"))
    assert code == 0
    labels = prepared / "cifar10" / "train_labels.npy"
    data = bytearray(labels.read_bytes())
    data[-1] ^= 1
    labels.write_bytes(bytes(data))
    code, err = run_cli(
        capsys, "train", "dataset=cifar10", f"data_dir={prepared}", "progress=false", "--run-dir", str(tmp_path / "run")
    )
    assert code == 2 and len(err) == 1 and "train_labels.npy" in err[0] and "checksum" in err[0], err
    assert not (tmp_path / "run").exists()


def test_cli_help_lists_config_keys(capsys):
    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    assert "method" in out and "petra" in out and "fidelity_every" in out


def test_fidelity_log_observes_without_changing_training(tmp_path):
    plain = train(cfg(epochs=1, k=2), tmp_path / "plain", log=lambda m: None)
    tracked = train(cfg(epochs=1, k=2, fidelity_every=2), tmp_path / "tracked", log=lambda m: None)
    assert untimed([plain]) == untimed([tracked])
    import pandas as pd

    frame = pd.read_csv(tmp_path / "tracked" / "fidelity.csv")
    assert set(frame["stage"]) == set(range(10)) and (frame["cosine"] <= 1 + 1e-9).all()
    assert (frame.loc[frame["stage"] == 9, "cosine"] > 0.99).all()  # the head: only its input is stale
    assert (frame["input_error"] >= 0).all() and (frame.loc[frame["stage"] == 9, "input_error"] == 0).all()


def test_run_directory_of_another_config_is_refused(tmp_path):
    from petra_core.run.config import ConfigError

    train(cfg(epochs=1), tmp_path / "a", log=lambda m: None)
    with pytest.raises(ConfigError, match="holds a run with k=1, not 2; use another run directory"):
        train(cfg(epochs=1, k=2), tmp_path / "a", log=lambda m: None)
    train(cfg(epochs=1, progress=True), tmp_path / "a", log=lambda m: None)  # watching differently is fine


def test_a_run_logs_one_line_per_epoch_without_a_progress_bar(tmp_path, capsys):
    """A Snakemake or SLURM log (progress=false) shows the run going: epoch, losses, speed, ETA."""
    config = {**tiny_run(synthetic_train=32, synthetic_test=16, batch_size=16, epochs=3), "progress": False}
    assert main(["train", *argv(config), "eval_every=2", "--run-dir", str(tmp_path / "run")]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in lines] == ["epoch 1/3", "epoch 2/3", "epoch 3/3"], lines
    assert all("train_loss " in line and "train_acc " in line and " images/s, ETA " in line for line in lines)
    assert "top1 " not in lines[0] and "top1 " in lines[1] and "test_loss " in lines[2]  # evaluated when due
    assert lines[2].endswith("ETA 0:00:00")
