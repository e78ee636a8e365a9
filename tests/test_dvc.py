"""DVC as its user expects: a fresh clone is up to date, `dvc repro` trains nothing, datasets and
checkpoints round-trip through a remote that `petra store` sets up."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from petra_core.workflow.store import artifacts, store

ROOT = Path(__file__).resolve().parents[1]
DVC = shutil.which("dvc", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
pytestmark = [
    pytest.mark.slow,  # every test runs dvc in a subprocess
    pytest.mark.skipif(DVC is None, reason="DVC is not installed (the `pipeline` extra)"),
]


def dvc(*args, cwd=ROOT):
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    return subprocess.run([DVC, *args], cwd=cwd, capture_output=True, text=True, env=env)


def test_the_committed_pipeline_is_up_to_date():
    """dvc.lock matches the code and records of this tree (in CI: of HEAD), so a fresh clone's
    `dvc status` is clean and `dvc repro` has nothing to run, training least of all."""
    status = dvc("status", "--quiet")
    assert status.returncode == 0, "dvc.lock is stale (run `dvc repro` and commit dvc.lock):\n" + dvc("status").stdout
    dry = dvc("repro", "--dry")
    assert dry.returncode == 0, dry.stderr
    assert "Running stage" not in dry.stdout, dry.stdout


def test_store_versions_data_and_checkpoints_through_a_remote(tmp_path, monkeypatch):
    repo, remote = tmp_path / "repo", tmp_path / "remote"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    assert dvc("init", "-q", cwd=repo).returncode == 0
    files = {
        "data/prepared/synthetic/train_images.npy": b"\x93NUMPY fake",
        "data/prepared/synthetic/manifest.json": b"{}",
        "checkpoints/smoke/synthetic/revnet18-w4/petra-k1-seed0/checkpoint.pt": b"weights",
    }
    for name, content in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(content)
    assert artifacts(repo) == [Path("checkpoints/smoke"), Path("data/prepared/synthetic")]
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    pointers = store(repo, remote=str(remote))
    assert pointers == [Path("checkpoints/smoke.dvc"), Path("data/prepared/synthetic.dvc")]
    assert all((repo / p).exists() for p in pointers) and any(remote.rglob("*"))
    for name in ("data/prepared/synthetic", "checkpoints/smoke", ".dvc/cache"):
        shutil.rmtree(repo / name)
    pulled = dvc("pull", cwd=repo)
    assert pulled.returncode == 0, pulled.stderr
    assert {name: (repo / name).read_bytes() for name in files} == files
