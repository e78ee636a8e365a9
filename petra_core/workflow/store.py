"""``petra store``: version datasets and checkpoints with DVC, in one command.

Run records (runs/) are small and committed to git; prepared datasets (data/prepared/NAME) and
checkpoints (checkpoints/PROFILE, the tree of a profile's runs) are not. ``petra store``:

1. sets up a DVC remote if the project has none, or if ``--remote URL`` is given (a local
   directory by default, ``../petra-dvc-remote``; any DVC remote URL: ``s3://``, ``ssh://``, ...);
2. ``dvc add``s every prepared dataset and every profile's checkpoint tree present here, which
   writes the ``.dvc`` pointer files (commit them with git);
3. ``dvc push``es the data to the remote.

On another machine, ``git pull && dvc pull`` brings them back. DVC (the ``pipeline`` extra) does
the work; this module only says what to store.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

DEFAULT_REMOTE = "../petra-dvc-remote"
REMOTE_NAME = "storage"
STORED = ("data/prepared", "checkpoints")  # each directory below these is one DVC-tracked artifact


class StoreError(ValueError):
    """DVC is missing or one of its commands failed (the message says which)."""


def _dvc(*args: str, root: Path, capture: bool = False) -> str:
    try:
        out = subprocess.run(["dvc", *args], cwd=root, check=True, text=True, capture_output=capture)
    except FileNotFoundError:
        raise StoreError("petra store needs DVC: pip install 'petra[pipeline]' (or .ci/setup)") from None
    except subprocess.CalledProcessError as err:
        raise StoreError(
            f"dvc {' '.join(args)} failed (exit {err.returncode})"
            + (f": {err.stderr.strip().splitlines()[-1]}" if err.stderr else "")
        ) from None
    return out.stdout or ""


def artifacts(root: Path) -> list[Path]:
    """What ``petra store`` versions here: every prepared dataset and every profile's checkpoints."""
    return sorted(
        p.relative_to(root) for base in STORED if (root / base).is_dir() for p in (root / base).iterdir() if p.is_dir()
    )


def ensure_remote(root: Path, url: str | None = None) -> str:
    """The default remote's name; set to ``url`` (or, if there is none, to the local default)."""
    try:
        current = _dvc("remote", "default", root=root, capture=True).strip()
    except StoreError:  # exit 1: no default remote
        current = ""
    if current and url is None:
        return current
    url = url or DEFAULT_REMOTE
    if "://" not in url:
        (root / url).mkdir(parents=True, exist_ok=True)
    _dvc("remote", "add", "--default", "--force", REMOTE_NAME, url, root=root)
    return REMOTE_NAME


def store(root: str | Path = ".", *, remote: str | None = None, push: bool = True) -> list[Path]:
    """Track every artifact with DVC and push it; returns the pointer files to commit."""
    root = Path(root)
    found = artifacts(root)
    if not found:
        return []
    name = ensure_remote(root, remote)
    _dvc("add", "--quiet", *map(str, found), root=root)
    if push:
        _dvc("push", "--remote", name, *map(str, found), root=root)
    return [p.with_name(p.name + ".dvc") for p in found]


def cmd_store(args) -> int:
    pointers = store(args.root, remote=args.remote, push=not args.no_push)
    if not pointers:
        print("nothing to store: no data/prepared/* or checkpoints/* here")
        return 0
    print("stored " + ", ".join(str(p.with_suffix("")) for p in pointers) + "; commit the pointers:")
    print("  git add " + " ".join(str(p) for p in pointers) + " .dvc/config")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "store",
        help="version prepared datasets and checkpoints with DVC (dvc add + push)",
        description="Track every prepared dataset (data/prepared/NAME) and every profile's "
        "checkpoints (checkpoints/PROFILE) with DVC and push them to the project's DVC "
        "remote, setting one up if there is none. Commit the .dvc pointers it lists; "
        "`dvc pull` brings the data back elsewhere.",
    )
    p.add_argument(
        "--remote", help=f"DVC remote URL or directory (default: the project's remote, else {DEFAULT_REMOTE})"
    )
    p.add_argument("--no-push", action="store_true", help="track with DVC, but push later (dvc push)")
    p.add_argument("--root", default=".", help="the repository root")
    p.set_defaults(func=cmd_store)
