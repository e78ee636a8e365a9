"""``petra train --fault-at``: the explicit fault injection that the resume tests drive."""

import json
import signal

import pytest

from petra_core.cli import main
from petra_core.run.config import ConfigError
from petra_core.run.faults import fault_hook, parse_faults


def test_a_fault_list_names_rank_tick_and_signal():
    assert parse_faults("1:16:SIGTERM, 0:start:SIGKILL,2:3") == [
        (1, 16, signal.SIGTERM),
        (0, -1, signal.SIGKILL),
        (2, 3, signal.SIGTERM),
    ]


@pytest.mark.parametrize(
    "spec, says",
    [
        ("1", "--fault-at '1' is not of the form RANK:TICK[:SIGNAL][,...]"),
        ("a:3", "--fault-at 'a:3' is not of the form RANK:TICK[:SIGNAL][,...]"),
        ("0:3:SIGNOPE", "--fault-at '0:3:SIGNOPE': unknown signal 'SIGNOPE'; use a name such as SIGTERM or SIGKILL"),
    ],
)
def test_a_bad_fault_list_is_one_line(spec, says):
    with pytest.raises(ConfigError) as err:
        parse_faults(spec)
    assert str(err.value) == says


def test_only_the_named_rank_gets_a_hook(monkeypatch):
    sent = []
    monkeypatch.setattr("os.kill", lambda pid, signum: sent.append(signum))
    assert fault_hook("1:4", rank=0) is None and fault_hook(None, rank=0) is None
    hook = fault_hook("1:4:SIGINT,0:2", rank=1)
    for tick in range(6):
        hook(tick)
    assert sent == [signal.SIGINT]


def test_the_cli_refuses_a_bad_fault_list_before_anything_runs(tmp_path, capsys):
    assert main(["train", "dataset=synthetic", "--run-dir", str(tmp_path / "run"), "--fault-at", "zero:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["petra: error: --fault-at 'zero:1' is not of the form RANK:TICK[:SIGNAL][,...]"], err
    assert not (tmp_path / "run").exists()


def test_a_run_stopped_by_a_fault_says_so_in_its_env_record(tmp_path):
    from conftest import argv, tiny_run

    run = tmp_path / "run"
    config = argv(tiny_run(epochs=1, synthetic_train=64, synthetic_test=32, batch_size=16, bn_reestimate_batches=0))
    assert main(["train", *config, "--run-dir", str(run), "--fault-at", "0:3:SIGINT"]) == 130
    env = json.loads((run / "env.json").read_text())
    assert env["fault_at"] == "0:3:SIGINT" and env["host_malloc"] in ("retain", "system")
    assert main(["train", *config, "--run-dir", str(run)]) == 0  # resumed without a fault
    assert "fault_at" not in json.loads((run / "env.json").read_text())
