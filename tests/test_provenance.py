"""Every committed run record names a clean code revision in main's history (its env.json's
``git_revision``), so a reviewer can check out the code that trained it. (The records of a
revision the repository never received, and of uncommitted code, were retrained at commits of
main: docs/reproducing.md, "Reproducing a record on another machine".)
"""

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def records():
    return sorted(p.parent for p in (ROOT / "runs").glob("**/env.json"))


def problem(revision: str | None) -> str | None:
    """Why a reviewer cannot check ``revision`` out (None: they can)."""
    if not revision:
        return "names no revision"
    if revision.endswith("-dirty"):
        return f"names a dirty revision ({revision[:10]}-dirty)"
    if git("cat-file", "-e", f"{revision}^{{commit}}").returncode != 0:
        return f"names {revision[:10]}, which is not in this repository"
    if git("merge-base", "--is-ancestor", revision, "HEAD").returncode != 0:
        return f"names {revision[:10]}, which is not an ancestor of HEAD"
    return None


@pytest.fixture(scope="module")
def history():
    if git("rev-parse", "--is-inside-work-tree").stdout.strip() != "true":
        pytest.skip("not a git checkout: no history to check revisions against")
    if git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("a shallow clone: the history the records name is not here (git fetch --unshallow)")


def test_every_record_names_a_clean_revision_in_mains_history(history):
    checked = {
        run.relative_to(ROOT).as_posix(): problem(json.loads((run / "env.json").read_text()).get("git_revision"))
        for run in records()
    }
    assert checked, "no run records found under runs/"
    bad = {run: why for run, why in checked.items() if why}
    assert not bad, "records a reviewer cannot check out:\n" + "\n".join(f"  {r}: {w}" for r, w in sorted(bad.items()))


def test_the_check_refuses_what_a_reviewer_cannot_check_out(history):
    head = git("rev-parse", "HEAD").stdout.strip()
    assert problem(head) is None
    assert "dirty" in problem(head + "-dirty")
    assert "not in this repository" in problem("0" * 40)
    assert problem(None) == "names no revision"
