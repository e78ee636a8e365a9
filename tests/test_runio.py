"""The run files' own helpers (run/runio.py): file modes without process-wide side effects."""

import os

from petra_core.run import runio


def test_the_umask_is_read_without_being_changed(tmp_path):
    before = os.umask(0o027)
    try:
        assert runio.current_umask() == 0o027
        assert runio.file_mode() == 0o640
        runio.atomic_write(tmp_path / "f.txt", lambda f: f.write(b"x"))
        assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o640
        assert os.umask(0o027) == 0o027  # still what it was set to
    finally:
        os.umask(before)
