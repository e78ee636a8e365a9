"""workflow/scripts/compare_retrained.py: a retrained record against the one it replaced, read from
git, with the fields that decide the bits that differ; a record that did not change is left out."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))

import compare_retrained  # noqa: E402


def record(run: Path, revision: str, cpu: str, top1: float, loss: float, capability: str | None = None):
    run.mkdir(parents=True, exist_ok=True)
    env = {"git_revision": revision, "torch": "2.14.1", "cpu_model": cpu}
    (run / "env.json").write_text(json.dumps(env if capability is None else {**env, "cpu_capability": capability}))
    (run / "metrics.json").write_text(json.dumps({"top1": top1, "train_loss": loss}))


def git(tmp, *args):
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp, check=True, capture_output=True
    )


def test_a_retrained_record_is_compared_with_the_one_it_replaced(tmp_path, monkeypatch, capsys):
    git(tmp_path, "init", "-q")
    record(tmp_path / "runs/p/a", "8ea0908", "EPYC 7B13", 45.58, 1.5549)
    record(tmp_path / "runs/p/b", "8ea0908", "EPYC 7B13", 50.0, 1.0)
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "old records")
    record(tmp_path / "runs/p/a", "56c32fd", "EPYC 9B14", 43.97, 1.5828, "AVX512")  # retrained elsewhere
    record(tmp_path / "runs/p/c", "56c32fd", "EPYC 9B14", 60.0, 0.5)  # new: nothing to compare with
    monkeypatch.chdir(tmp_path)
    assert compare_retrained.main(["runs/p", "--before", "HEAD", "--out", "retrained.csv"]) == 0
    (row,) = compare_retrained.compare(Path("runs/p"), "HEAD")
    assert row["run"] == "runs/p/a" and row["top1_difference"] == round(43.97 - 45.58, 4)
    assert row["differing"] == "git_revision cpu_model" and row["unknown_before"] == "cpu_capability"
    assert (tmp_path / "retrained.csv").read_text().splitlines()[1].startswith("runs/p/a,8ea0908,56c32fd,45.58,43.97")
    assert "1 retrained run(s): mean |top-1 difference| 1.61" in capsys.readouterr().out


def test_a_revision_that_is_not_there_is_one_line(tmp_path, monkeypatch, capsys):
    git(tmp_path, "init", "-q")
    monkeypatch.chdir(tmp_path)
    assert compare_retrained.main(["runs", "--before", "nope"]) == 2
    assert capsys.readouterr().err.strip() == "compare_retrained: --before 'nope' is not a commit of this repository"
