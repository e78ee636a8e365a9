"""workflow/scripts/upgrade_records.py: a record written before a config key existed gets the key
with the value the run had (not today's default), an ``upgraded`` entry says so, and nothing the
run measured changes; a record that needs nothing is left as it is."""

import json
import shutil
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))

import upgrade_records  # noqa: E402

RECORD = ROOT / "runs/cpu/cifar10/revnet18-w16/delayed-k2-seed0"  # has every field and key


def old_record(tmp_path: Path) -> Path:
    """A committed record as a petra before channels_last wrote it: no such key, one earlier upgrade."""
    run = tmp_path / "run"
    shutil.copytree(RECORD, run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    del config["channels_last"]
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["upgraded"] = {"fields": ["params"], "from": "config.yaml", "by": "x", "revision": "r0"}
    (run / "metrics.json").write_text(json.dumps(metrics))
    return run


def test_a_record_without_channels_last_gets_the_value_it_ran_with(tmp_path):
    run = old_record(tmp_path)
    before = json.loads((run / "metrics.json").read_text())
    assert upgrade_records.upgrade(run, "r1") is True
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["channels_last"] is False
    assert {k: v for k, v in config.items() if k != "channels_last"} == {
        k: v for k, v in yaml.safe_load((RECORD / "config.yaml").read_text()).items() if k != "channels_last"
    }
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["upgraded"] == [
        before["upgraded"],
        {
            "config": {"channels_last": False},
            "from": "the value of every run before the key existed (59e6209)",
            "by": "workflow/scripts/upgrade_records.py",
            "revision": "r1",
        },
    ]
    assert {k: v for k, v in metrics.items() if k != "upgraded"} == {k: v for k, v in before.items() if k != "upgraded"}
    assert upgrade_records.upgrade(run, "r2") is False, "an upgraded record needs nothing more"


def test_a_current_record_is_left_as_it_is(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RECORD, run)
    assert upgrade_records.upgrade(run, "r1") is False
    for name in ("config.yaml", "metrics.json"):
        assert (run / name).read_bytes() == (RECORD / name).read_bytes()
