"""``petra revision --check``: may a grid run be trained at this code revision?

Every record names the code revision that trained it (``env.json``'s ``git_revision``), and a
reviewer must be able to check that revision out. So the grid's train rule refuses a revision
that is dirty (tracked files changed but not committed: no revision holds the code; run records
under ``runs/`` do not count, since a grid's runs write them while it trains) or that is
not in main's history (a local branch, a commit not yet merged: it may never reach the
repository). "main" is the local branch of that name or any remote's; a repository that has
neither cannot tell, and the check lets a clean revision through with a warning.
``--config require_clean_revision=false`` turns the check off (for experiments not meant to be
committed).

It also refuses a grid whose code is another checkout's: a worktree that runs the ``petra`` of
another checkout's environment (an editable install of main, a symlinked ``.venv``) would train
main's code, and its records would name main's revision, while its Snakefile and profiles are the
worktree's. The workflow's rules put their own checkout first on ``PYTHONPATH`` (common.smk).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ..run import runio

MAIN = "main"


class RevisionError(ValueError):
    """The revision cannot name a record (the message says why and what to do)."""


def _git(*args: str, root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)


def main_refs(root: Path) -> list[str]:
    """The refs named main: the local branch and every remote's."""
    out = _git("for-each-ref", "--format=%(refname)", "refs/heads", "refs/remotes", root=root).stdout.split()
    return [r for r in out if r == f"refs/heads/{MAIN}" or (r.startswith("refs/remotes/") and r.endswith(f"/{MAIN}"))]


def toplevel(folder: Path) -> Path | None:
    """The top of the git checkout (repository or worktree) that holds ``folder``; None outside one."""
    try:
        top = _git("rev-parse", "--show-toplevel", root=folder)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(top.stdout.strip()).resolve() if top.returncode == 0 else None


def check_same_checkout(workdir: str | Path, code: str | Path | None = None) -> None:
    """Raises :class:`RevisionError` if ``workdir`` (where the workflow runs) is in one git checkout
    and ``code`` (default: this package) in another: the records would name a revision the grid's
    own checkout does not hold. A ``workdir`` outside any checkout runs whatever code is installed."""
    code = Path(code) if code is not None else Path(__file__).resolve().parent
    here, there = toplevel(Path(workdir)), toplevel(code)
    if here is None or there is None or here == there:
        return
    raise RevisionError(
        f"the code is {there}'s but the workflow runs in {here}: its records would name {there}'s revision; "
        f"put {here} first on PYTHONPATH (the Snakefile's rules do) or install petra from it"
    )


def check_revision(root: str | Path | None = None) -> str:
    """The revision of the code in ``root`` (default: this package's), if a record may name it;
    raises :class:`RevisionError` otherwise."""
    root = Path(root) if root is not None else Path(__file__).resolve().parent
    try:
        head = _git("rev-parse", "HEAD", root=root)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RevisionError(f"cannot read the code revision (git: {err}); a record must name one") from None
    if head.returncode != 0:
        raise RevisionError(f"{root} is not in a git repository: a record must name the revision that trained it")
    revision = head.stdout.strip()
    try:
        changed = runio.changed_files(root)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RevisionError(f"cannot read the code revision (git: {err}); a record must name one") from None
    if changed:
        raise RevisionError(
            f"revision {revision[:10]} is dirty ({len(changed)} changed file(s), e.g. {changed[0]}): "
            "commit first, so that the records name code a reviewer can check out "
            "(or --config require_clean_revision=false for runs not meant to be committed)"
        )
    refs = main_refs(root)
    if not refs:
        print(
            f"petra: warning: no branch named {MAIN} here: cannot tell whether {revision[:10]} is in main's history",
            file=sys.stderr,
        )
        return revision
    if not any(_git("merge-base", "--is-ancestor", revision, ref, root=root).returncode == 0 for ref in refs):
        raise RevisionError(
            f"revision {revision[:10]} is not in {MAIN}'s history ({', '.join(refs)}): merge it into "
            f"{MAIN} first (or train from a worktree at a commit of {MAIN}), so that the records "
            "name a revision a reviewer can check out"
        )
    return revision


def cmd_revision(args) -> int:
    try:
        if args.root is None:
            check_same_checkout(Path.cwd())
        revision = check_revision(args.root)
    except RevisionError as err:
        print(f"petra: error: {err}", file=sys.stderr)
        return 2
    print(revision)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "revision",
        help="print the code revision, if a grid run may be trained at it",
        description="Print the git revision of the code; exit 2 with one line if it is dirty, "
        f"not in {MAIN}'s history (a record could not name it) or, without --root, another checkout's "
        "than the working directory's. The Snakemake train rule runs it before every run.",
    )
    p.add_argument("--check", action="store_true", help="(the default and only mode; kept for readable rules)")
    p.add_argument("--root", help="a directory inside the repository (default: the petra_core package's)")
    p.set_defaults(func=cmd_revision)
