"""A file generated from a source of truth (dvc.yaml from the study registry, params.yaml from a
profile): written, or, with ``check``, compared with what the source gives now, so that CI and
tests catch one edited by hand or left behind."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(path: Path, text: str, *, check: bool, stale: str, wrote: str) -> int:
    """Write ``text`` to ``path`` and print ``wrote``; with ``check``, write nothing and return 1
    (``stale`` on stderr: what to run) if the file is missing or differs. The exit status."""
    if check:
        if not path.exists() or path.read_text() != text:
            print(stale, file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(wrote)
    return 0
