"""``petra revision --check`` (petra_core/workflow/revision.py): the grid trains only at a revision a
record can name: committed, and in main's history."""

import subprocess
from pathlib import Path

import pytest

from petra_core.workflow.revision import RevisionError, check_revision, check_same_checkout


def git(*args, cwd):
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True, capture_output=True
    )


@pytest.fixture
def repo(tmp_path):
    git("init", "-q", "-b", "main", cwd=tmp_path)
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "code.py", cwd=tmp_path)
    git("commit", "-q", "-m", "one", cwd=tmp_path)
    return tmp_path


def test_a_clean_revision_in_main_is_named(repo):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert check_revision(repo) == head
    (repo / "new.txt").write_text("untracked files do not count\n")
    assert check_revision(repo) == head


def test_a_dirty_revision_is_refused_in_one_line(repo):
    (repo / "code.py").write_text("x = 2\n")
    with pytest.raises(RevisionError, match=r"is dirty \(1 changed file\(s\), e.g. code.py\): commit first") as err:
        check_revision(repo)
    assert "\n" not in str(err.value)


def test_a_revision_outside_mains_history_is_refused(repo):
    git("checkout", "-q", "-b", "side", cwd=repo)
    (repo / "code.py").write_text("x = 3\n")
    git("commit", "-q", "-am", "side", cwd=repo)
    with pytest.raises(RevisionError, match=r"is not in main's history \(refs/heads/main\): merge it into main first"):
        check_revision(repo)
    git("checkout", "-q", "--detach", "main", cwd=repo)  # a worktree at a commit of main, detached
    check_revision(repo)


def test_no_main_branch_lets_a_clean_revision_through_with_a_warning(repo, capsys):
    git("branch", "-m", "main", "trunk", cwd=repo)
    check_revision(repo)
    assert "no branch named main here" in capsys.readouterr().err


def test_outside_a_repository_nothing_can_be_named(tmp_path):
    with pytest.raises(RevisionError, match="is not in a git repository"):
        check_revision(tmp_path)


def test_a_worktree_running_another_checkouts_code_is_refused_in_one_line(repo, tmp_path_factory):
    """A grid in a worktree of main, run with main's editable install, would train main's code and
    name main's revision: refused, naming both checkouts and the fix. Its own code passes, and a
    working directory outside any checkout runs whatever is installed."""
    worktree = tmp_path_factory.mktemp("grid") / "grid"
    git("worktree", "add", "-q", "--detach", str(worktree), "main", cwd=repo)
    (repo / "pkg").mkdir()
    with pytest.raises(
        RevisionError, match=r"the code is .* but the workflow runs in .*grid: .* first on PYTHONPATH"
    ) as e:
        check_same_checkout(worktree, code=repo / "pkg")
    assert "\n" not in str(e.value) and str(repo.resolve()) in str(e.value)
    check_same_checkout(worktree, code=worktree)
    check_same_checkout(repo / "pkg", code=repo)
    check_same_checkout(tmp_path_factory.mktemp("scratch"), code=repo / "pkg")


def test_petra_train_in_another_checkout_than_its_codes_warns_in_one_line(repo, tmp_path_factory, monkeypatch, capsys):
    """Run by hand in a worktree with main's install, ``petra train`` trains main's code (and its
    record names main's revision): it says so; outside any checkout it says nothing."""
    from conftest import argv, tiny_run

    import petra_core
    from petra_core.cli import main
    from petra_core.workflow.revision import toplevel

    if toplevel(Path(petra_core.__file__).parent) is None:
        pytest.skip("petra_core is installed, not imported from a checkout: no other checkout to tell apart")
    config = argv(tiny_run(epochs=1, synthetic_train=32, synthetic_test=16, batch_size=16))
    runs = tmp_path_factory.mktemp("runs")
    monkeypatch.chdir(repo)  # a checkout, but not the one petra_core is imported from
    assert main(["train", *config, "--run-dir", str(runs / "a")]) == 0
    warning = [line for line in capsys.readouterr().err.splitlines() if line.startswith("petra: warning:")]
    assert len(warning) == 1 and f"the workflow runs in {repo.resolve()}" in warning[0], warning
    monkeypatch.chdir(tmp_path_factory.mktemp("scratch"))
    assert main(["train", *config, "--run-dir", str(runs / "b")]) == 0
    assert "petra: warning" not in capsys.readouterr().err


def test_the_rules_run_the_code_of_their_own_checkout():
    """common.smk puts the checkout the Snakefile read first on the rules' PYTHONPATH (the end-to-end
    proof is tests/test_workflow.py's smoke grid in a clone, which the check above would refuse)."""
    import os

    from petra_core.workflow import grid

    smk = (Path(__file__).resolve().parents[1] / "workflow/rules/common.smk").read_text()
    namespace = {"grid": grid, "os": os, "Path": Path}
    line = next(x for x in smk.splitlines() if x.startswith("CHECKOUT = "))
    exec(line, namespace)
    assert Path(namespace["CHECKOUT"]) == Path(__file__).resolve().parents[1]
    assert 'os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [CHECKOUT,' in smk


def test_the_train_rule_checks_the_revision_before_training():
    from pathlib import Path

    rule = (Path(__file__).resolve().parents[1] / "workflow/rules/train.smk").read_text()
    assert 'check="petra revision --check &&" if REQUIRE_CLEAN_REVISION' in rule
    assert "( {params.check} petra with-gpus" in rule


def test_a_writers_own_records_do_not_make_its_revision_dirty(repo):
    """runio.git_revision(outputs=...): a benchmark rewriting its committed record leaves the next
    benchmark's revision clean; any other change, from any folder, still makes it dirty."""
    from petra_core.run.runio import git_revision

    (repo / "results" / "benchmarks").mkdir(parents=True)
    (repo / "results" / "benchmarks" / "bench.json").write_text("{}\n")
    git("add", "results", cwd=repo)
    git("commit", "-q", "-m", "a record", cwd=repo)
    head = git_revision(repo=repo)
    assert not head.endswith("-dirty")
    (repo / "results" / "benchmarks" / "bench.json").write_text('{"again": 1}\n')
    assert git_revision(repo=repo) == head + "-dirty"
    assert git_revision(outputs=("results/benchmarks",), repo=repo) == head
    assert git_revision(outputs=("results/benchmarks",), repo=repo / "results") == head  # paths from the top
    (repo / "code.py").write_text("x = 2\n")
    assert git_revision(outputs=("results/benchmarks",), repo=repo / "results") == head + "-dirty"


def test_run_records_do_not_make_a_grid_revision_dirty(repo):
    """A grid's runs write records under runs/ while the next run's check asks whether the code is
    clean (and a worktree that retrains committed records rewrites them): records are not code, so
    neither the check nor a record's revision counts them; code beside them still does."""
    from petra_core.run.runio import git_revision

    run = repo / "runs" / "budget" / "a"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("seed: 0\n")
    git("add", "runs", cwd=repo)
    git("commit", "-q", "-m", "a record", cwd=repo)
    head = git_revision(repo=repo)
    (run / "config.yaml").write_text("seed: 0\nretrained: true\n")  # the record being retrained
    assert check_revision(repo) == head and git_revision(repo=repo) == head
    (repo / "code.py").write_text("x = 2\n")
    with pytest.raises(RevisionError, match="dirty .1 changed file.s., e.g. code.py"):
        check_revision(repo)
    assert git_revision(repo=repo) == head + "-dirty"
