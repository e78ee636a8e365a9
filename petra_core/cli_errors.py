"""The ``petra`` command's error boundary: what a user can fix becomes one line and an exit code.

A traceback tells a reviewer nothing they can act on when a disk is full, a directory is not
writable, an input is missing or Ctrl-C arrives before a run starts. :func:`run_guarded` turns
each of these into ``petra: error: PATH: what happened; what to do`` on stderr and a distinct exit
status (``EXIT_CODES``, listed in ``petra --help`` and the README). Everything else is a bug and
keeps its traceback. Files petra writes go through ``runio.atomic_write``, so an error here never
leaves a half-written file behind.
"""

from __future__ import annotations

import errno
import sys

EXIT_OK = 0
EXIT_BAD_INPUT = 2  # a bad config, argument or data (argparse's own code for a bad argument)
EXIT_DIVERGED = 3
EXIT_FILESYSTEM = 4
EXIT_MISSING_INPUT = 5
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's convention

EXIT_CODES = {
    EXIT_OK: "success",
    1: "verify: not bit-identical; readme --check: a rendered block differs",
    EXIT_BAD_INPUT: "bad config, argument or data (the line names the key or path)",
    EXIT_DIVERGED: "the run diverged (NaN or infinite loss or weights); the last good checkpoint is kept",
    EXIT_FILESYSTEM: "a file or directory could not be written or read (permission, full disk, a file in the path)",
    EXIT_MISSING_INPUT: "an input is missing (results not gathered, runs not finished, a file that does not exist)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C or SIGTERM); a started run wrote a checkpoint to resume from",
}

_ADVICE = {
    errno.EACCES: "permission denied; choose a location you can write (e.g. under your home) or fix its permissions",
    errno.EPERM: "operation not permitted; choose a location you can write or fix its permissions",
    errno.EROFS: "read-only file system; choose a writable location",
    errno.ENOSPC: "no space left on the device; free some space (or choose another disk) and run the command again",
    errno.EDQUOT: "disk quota exceeded; free some space (or choose another disk) and run the command again",
    errno.ENOTDIR: "a part of this path is a file, not a directory; choose another path",
    errno.EISDIR: "is a directory where a file was expected; choose a file path",
    errno.EEXIST: "already exists as something else; choose another path",
    errno.ENOENT: "does not exist; check the path (an input of this command is made by another command first)",
}


def exit_codes_epilog() -> str:
    """The exit statuses, for ``petra --help``."""
    return "exit status:\n" + "\n".join(f"  {code:<4} {meaning}" for code, meaning in EXIT_CODES.items())


def describe_os_error(err: OSError, fallback_path: str | None = None) -> str:
    """One line: the path, what happened, what to do. A message petra wrote itself (an OSError
    subclass raised with one argument, e.g. ``MissingRuns``) is kept as it is."""
    if err.errno is None and err.args:
        return str(err)
    path = err.filename if err.filename is not None else fallback_path
    what = _ADVICE.get(err.errno, f"{err.strerror or type(err).__name__}; check the path and run the command again")
    if err.filename2 is not None:
        path = f"{path} -> {err.filename2}"
    return f"{path}: {what}" if path is not None else what


def output_path(args) -> str | None:
    """Where the command writes, to name when the OS did not say which file failed (a full disk)."""
    for name in ("run_dir", "out", "checkpoint_dir", "readme"):
        value = getattr(args, name, None)
        if isinstance(value, str):
            return value
    return None


def run_guarded(func, args) -> int:
    """Run ``func(args)``; the errors a user can fix become one line on stderr and an exit status."""
    try:
        return func(args)
    except ValueError as err:  # ConfigError, DataError, DamagedFile and the engine's checks subclass it
        return _say(str(err), EXIT_BAD_INPUT)
    except FileNotFoundError as err:
        return _say(describe_os_error(err, output_path(args)), EXIT_MISSING_INPUT)
    except OSError as err:
        return _say(describe_os_error(err, output_path(args)), EXIT_FILESYSTEM)
    except KeyboardInterrupt:
        path = output_path(args)
        return _say(
            f"interrupted{f' (output: {path})' if path else ''}; nothing is half-written (petra replaces "
            "a file only once it is whole): run the same command again",
            EXIT_INTERRUPTED,
            prefix="stopped",
        )


def _say(line: str, code: int, prefix: str = "error") -> int:
    print(f"petra: {prefix}: {line}", file=sys.stderr)
    return code
