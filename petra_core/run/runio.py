"""Run-directory files: written atomically, so an interrupted write never loses what was there.

A run directory holds ``config.yaml`` (resolved), ``env.json`` (versions, git revision,
device, threads), ``history.json`` (one record per epoch), ``metrics.json`` (final) and
``checkpoint.pt`` (everything needed to resume exactly, including the in-flight pipeline).
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

CONFIG, ENV, HISTORY, METRICS, CHECKPOINT = "config.yaml", "env.json", "history.json", "metrics.json", "checkpoint.pt"
FIDELITY = "fidelity.csv"  # a run's gradient-fidelity log (fidelity_every > 0)
# the measured cost tables (``petra costs``, accounting) that the report reads (results/costs/)
CYCLIC_FILES = ("cyclic_profile.csv", "cyclic_summary.csv", "cyclic.json")  # petra cyclic
COST_FILES = ("table1_per_stage.csv", "table1.csv", "network_costs.csv", "table3.csv", "fidelity.csv", "costs.json")
# where each study's records are (results/cdp, results/wash, ...): its declaration,
# workflow/studies/NAME.yaml (petra_core.workflow.studies)
# a profile's DVC metrics (results/PROFILE/metrics/GROUP.json, petra results): a file per group of
# runs, since `dvc metrics show` prints a row per file
METRICS_DIR = "metrics"
GPU_RESULTS = "results/gpu"  # benchmarks/bench_gpu.py's files (<GPU>.json), Table 1's GPU section


def current_umask() -> int:
    """The process's umask, read without changing it (Linux: /proc/self/status). Elsewhere the only
    way is to set and restore it, done here on demand, never at import."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """What a plain open() would give a new file: readable by the group on a shared cluster."""
    return 0o666 & ~current_umask()


def atomic_write(path: Path, write) -> None:
    """Write via a temporary file in the same directory, fsync, then rename over ``path``.
    The file gets the mode a plain ``open()`` would give it (not mkstemp's private 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:  # name the directory the user must fix, not a temporary name in it
        raise OSError(err.errno, err.strerror, str(path.parent)) from err
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        if err.filename is None:  # a full disk fails in write() or fsync(), which name no file
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode()))


def finite_json(obj):
    """``obj`` with every NaN or infinite float replaced by None (strict JSON has no NaN); a dict
    that held one gets ``"non_finite": {key: "nan" | "inf" | "-inf"}``, the reason."""
    if isinstance(obj, dict):
        out, reasons = {}, {}
        for key, value in obj.items():
            if isinstance(value, float) and not math.isfinite(value):
                out[key], reasons[key] = None, repr(value)
            else:
                out[key] = finite_json(value)
        if reasons:
            out["non_finite"] = reasons
        return out
    if isinstance(obj, (list, tuple)):
        return [None if isinstance(v, float) and not math.isfinite(v) else finite_json(v) for v in obj]
    return obj


def write_json(path: Path, obj) -> None:
    """Strict JSON (no NaN or Infinity): non-finite numbers become null, see :func:`finite_json`."""
    write_text(path, json.dumps(finite_json(obj), indent=2, sort_keys=False, allow_nan=False) + "\n")


def write_yaml(path: Path, obj) -> None:
    write_text(path, yaml.safe_dump(obj, sort_keys=False))


class DamagedFile(ValueError):
    """A file petra wrote cannot be read back: truncated or corrupted on disk (one line: which
    file, what is wrong, what to do)."""

    def __init__(self, path: Path, what: str, advice: str):
        super().__init__(f"{path} is damaged ({what}): {advice}")
        self.path = Path(path)


def _what(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {text[:160]}" if text else type(err).__name__


RECORD_ADVICE = (
    "a full disk, an interrupted copy or a partial pull leaves files so; if the run finished and its "
    "checkpoint is there, delete FILE and the run's metrics.json and run the same petra train again (it rebuilds the "
    "records from the checkpoint in seconds); if the record is committed, restore it (git checkout -- FILE); "
    "or train the run again"
)
CHECKPOINT_ADVICE = (
    "a full disk, an interrupted copy or a partial `dvc pull` leaves files so; fetch it again "
    "(dvc pull), or delete it to train the run from the start"
)


def read_json(path: Path):
    """A run record (JSON) petra wrote; :class:`DamagedFile` if it cannot be parsed."""
    try:
        return json.loads(Path(path).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DamagedFile(path, _what(err), RECORD_ADVICE.replace("FILE", str(path))) from None


def read_yaml(path: Path):
    """A run's ``config.yaml``; :class:`DamagedFile` if it cannot be parsed."""
    try:
        return yaml.safe_load(Path(path).read_text())
    except (UnicodeDecodeError, yaml.YAMLError) as err:
        raise DamagedFile(path, _what(err), RECORD_ADVICE.replace("FILE", str(path))) from None


def save_checkpoint(path: Path, state: dict) -> None:
    import torch  # here, not at the top: the report and the CLI read run files without torch

    atomic_write(path, lambda f: torch.save(state, f))


def load_checkpoint(path: Path) -> dict:
    """A checkpoint (or part) petra wrote; :class:`DamagedFile` if it cannot be read back."""
    import torch

    # our own file: it holds dataclass messages and optimizer state, so not weights_only
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except FileNotFoundError:
        raise
    except Exception as err:  # noqa: BLE001 - torch.load raises many kinds on a truncated or corrupt file
        raise DamagedFile(path, _what(err), CHECKPOINT_ADVICE) from None
    if not isinstance(state, dict):
        raise DamagedFile(path, f"holds a {type(state).__name__}, not a petra checkpoint", CHECKPOINT_ADVICE)
    return state


RECORDS_ROOT = "runs"  # run records: what training writes, never what it reads as code


def changed_files(here: Path, outputs: tuple[str, ...] = ()) -> list[str]:
    """Tracked files that differ from HEAD, less the run records (``runs/``: a grid's other runs
    write them while this one trains, and a worktree that retrains committed records rewrites them)
    and ``outputs`` (paths from the repository's top, such as a benchmark's own records). Raises
    OSError or subprocess.TimeoutExpired if git cannot be asked."""
    exclude = [f":(top,exclude){path}" for path in (RECORDS_ROOT, *outputs)]
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", ":/", *exclude],
        cwd=here,
        capture_output=True,
        text=True,
        timeout=10,
    )
    return [line[3:] for line in status.stdout.split("\n") if line.strip()]


def git_revision(outputs: tuple[str, ...] = (), repo: Path | None = None) -> str | None:
    """HEAD, with ``-dirty`` if a tracked file other than a record differs from it (see
    :func:`changed_files`; ``outputs`` are left out too). ``repo``: any folder in the repository
    (default: this package's)."""
    here = Path(repo) if repo is not None else Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if rev.returncode != 0:
            return None
        changed = changed_files(here, outputs)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return rev.stdout.strip() + ("-dirty" if changed else "")


def environment(device: str) -> dict:
    """What a reader needs to interpret the run's numbers."""
    import torch
    import torchvision

    from .. import __version__
    from ..precision import numerics

    env = {
        "petra": __version__,
        "git_revision": git_revision(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "umask": f"{current_umask():03o}",  # the mode of every file the run writes (atomic_write)
        # what decides whether another machine can reproduce the run's bits (``petra verify``)
        "cpu_model": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        **numerics(),
    }
    if device == "cuda" and torch.cuda.is_available():
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()
    return env


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
