"""The CLI's error boundary: an unwritable directory, a full disk, a missing input, unfinished runs
and Ctrl-C at start-up each end in one line naming the path, a distinct exit status and no
traceback (petra_core/cli_errors.py).

Tests run as root, where chmod stops no write: a path under a regular *file* (NotADirectoryError)
stands for an unwritable directory, and mocks raise PermissionError and ENOSPC where the OS would.
"""

import errno
import os

import pytest
import yaml
from conftest import argv, tiny_run

from petra_core import cli_errors
from petra_core.cli import main
from petra_core.run import runio

RUN = tiny_run(synthetic_train=32, synthetic_test=16, batch_size=16, epochs=1)


def one_line(capsys) -> str:
    """stderr, which must be one line and no traceback."""
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "a_file"
    path.write_text("not a directory\n")
    return path


def test_train_into_a_path_under_a_file_is_one_line(a_file, capsys):
    run_dir = a_file / "run"
    assert main(["train", *argv(RUN), "--run-dir", str(run_dir)]) == cli_errors.EXIT_FILESYSTEM
    err = one_line(capsys)
    assert err.startswith("petra: error: ") and str(a_file) in err and "not a directory" in err


def test_train_into_a_directory_without_permission_is_one_line(tmp_path, monkeypatch, capsys):
    """mkstemp opens its temporary file with os.open: refused as an unwritable directory would."""
    run_dir = tmp_path / "run"

    def refuse(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    monkeypatch.setattr(os, "open", refuse)
    assert main(["train", *argv(RUN), "--run-dir", str(run_dir)]) == cli_errors.EXIT_FILESYSTEM
    err = one_line(capsys)
    assert err.startswith(f"petra: error: {run_dir}: permission denied; choose a location you can write")


def test_a_full_disk_names_the_file_and_leaves_nothing_half_written(tmp_path, monkeypatch, capsys):
    """write() and fsync() on a full disk name no file: the boundary names the one being written."""
    run_dir = tmp_path / "run"

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    assert main(["train", *argv(RUN), "--run-dir", str(run_dir)]) == cli_errors.EXIT_FILESYSTEM
    err = one_line(capsys)
    assert str(run_dir) in err and "no space left on the device" in err
    assert not [p for p in run_dir.rglob("*") if p.is_file()], "a half-written file was left behind"


def test_tables_without_results_names_the_file_and_the_command_that_makes_it(tmp_path, capsys):
    results = tmp_path / "results" / "cpu"
    assert main(["tables", "--results", str(results), "--out", str(tmp_path / "t")]) == cli_errors.EXIT_MISSING_INPUT
    err = one_line(capsys)
    assert str(results / "results.csv") in err and f"--out {results}" in err
    assert not (tmp_path / "t").exists()


def test_tables_into_an_unwritable_out_is_one_line(tmp_path, a_file, monkeypatch, capsys):
    """With its inputs present, the out directory's failure is what is reported."""
    from petra_core.report import tables

    def unwritable(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(a_file / "tables"))

    monkeypatch.setattr(tables, "render_all", unwritable)
    code = main(["tables", "--results", str(tmp_path), "--out", str(a_file / "tables")])
    assert code == cli_errors.EXIT_FILESYSTEM
    assert str(a_file / "tables") in one_line(capsys)


def test_prepare_into_a_path_under_a_file_is_one_line(a_file, capsys):
    out = a_file / "prepared" / "synthetic"
    assert main(["prepare", "synthetic", "--out", str(out)]) == cli_errors.EXIT_FILESYSTEM
    err = one_line(capsys)
    assert str(a_file) in err and "not a directory" in err


def unfinished_profile(tmp_path):
    profile = {
        "profile": "unfinished",
        "train": {"dataset": "synthetic", "width": 4, "epochs": 1},
        "grid": [{"arch": ["revnet18"], "method": ["petra", "backprop"], "k": [1], "seed": [0]}],
    }
    path = tmp_path / "unfinished.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def test_unfinished_runs_are_one_line_advising_the_flag(tmp_path, capsys):
    profile = str(unfinished_profile(tmp_path))
    code = main(["results", "--profile", profile, "--out", str(tmp_path / "o"), "--root", str(tmp_path)])
    assert code == cli_errors.EXIT_MISSING_INPUT
    err = one_line(capsys)
    assert "2 of 2 runs" in err and "--allow-missing" in err and "runs/unfinished/synthetic/revnet18-w4/" in err
    assert not (tmp_path / "o").exists()


def test_allow_missing_names_the_runs_it_leaves_out(tmp_path, capsys):
    main(
        [
            "results",
            "--profile",
            str(unfinished_profile(tmp_path)),
            "--out",
            str(tmp_path / "o"),
            "--root",
            str(tmp_path),
            "--allow-missing",
        ]
    )
    err = capsys.readouterr().err
    assert "left out 2 of 2 runs" in err
    assert "revnet18-w4/petra-k1-seed0" in err and "revnet18-w4/backprop-k1-seed0" in err


def test_ctrl_c_at_start_up_is_one_line(tmp_path, monkeypatch, capsys):
    from petra_core.run.config import RunConfig

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(RunConfig, "load", interrupted)
    run_dir = tmp_path / "run"
    assert main(["train", *argv(RUN), "--run-dir", str(run_dir)]) == cli_errors.EXIT_INTERRUPTED
    assert one_line(capsys).startswith(f"petra: stopped: interrupted (output: {run_dir}); nothing is half-written")
    assert not run_dir.exists()


def test_an_error_without_a_file_is_named_by_the_commands_output():
    class Args:
        out = "results/x"

    line = cli_errors.describe_os_error(OSError(errno.ENOSPC, "No space left on device"), cli_errors.output_path(Args))
    assert line.startswith("results/x: no space left")


def test_a_damaged_record_advises_the_rebuild_from_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text("{trunc")
    with pytest.raises(runio.DamagedFile, match="delete .*metrics.json and the run's metrics.json and run the same"):
        runio.read_json(path)


def test_every_exit_code_is_in_the_help(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for code in cli_errors.EXIT_CODES:
        assert f"  {code} " in out


def test_prepare_on_a_full_disk_names_the_output_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    out = tmp_path / "prepared" / "synthetic"

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    assert main(["prepare", "synthetic", "--out", str(out)]) == cli_errors.EXIT_FILESYSTEM
    err = one_line(capsys)
    assert err.startswith(f"petra: error: {out}: no space left on the device")
    assert list(out.parent.iterdir()) == [], "a half-written dataset was left behind"


def test_resuming_into_a_directory_without_permission_is_one_line(tmp_path, monkeypatch, capsys):
    from petra_core.run.config import RunConfig
    from petra_core.run.trainer import train

    run_dir = tmp_path / "run"
    config = {**RUN, "epochs": 2}
    train(RunConfig.from_dict(config), run_dir, until_epoch=1, log=lambda msg: None)  # a checkpoint, no metrics
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}

    def refuse(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    monkeypatch.setattr(os, "open", refuse)
    assert main(["train", *argv(config), "--run-dir", str(run_dir)]) == cli_errors.EXIT_FILESYSTEM
    assert one_line(capsys).startswith(f"petra: error: {run_dir}: permission denied")
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before  # nothing half-written
