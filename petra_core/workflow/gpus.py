"""``petra with-gpus N -- COMMAND``: run COMMAND on N GPUs of its own (Snakemake's local GPU slots).

Snakemake counts GPUs (``--resources gpu=4`` starts at most 4 GPUs' worth of runs at once) but
does not say which GPU a job gets. This wrapper claims N of the visible GPUs that no other
wrapper holds (an exclusive ``flock`` on a lock file per GPU, released when COMMAND exits, even
if it is killed), sets ``CUDA_VISIBLE_DEVICES`` to them and replaces itself with COMMAND. So
``snakemake --cores 16 --resources gpu=4`` runs 4 single-GPU runs side by side, one per GPU.
On SLURM the job's ``CUDA_VISIBLE_DEVICES`` is what it may use, and it claims among those. With
N = 0 the command sees no GPU.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from pathlib import Path

LOCK_DIR = Path(os.environ.get("PETRA_GPU_LOCKS", Path(tempfile.gettempdir()) / "petra-gpu-locks"))


def visible_gpus() -> list[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else every one CUDA sees."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def claim(n: int, gpus: list[str], lock_dir: Path = LOCK_DIR, *, wait: float = 3600.0) -> tuple[list[str], list[int]]:
    """``n`` of ``gpus`` that no other claimant holds, and the open lock files that hold them
    (closing them, or ending the process, releases the GPUs). Waits up to ``wait`` seconds."""
    if n > len(gpus):
        raise ValueError(f"with-gpus {n}: only {len(gpus)} GPU(s) visible ({','.join(gpus) or 'none'})")
    lock_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait
    while True:
        held: list[tuple[str, int]] = []
        for gpu in gpus:
            fd = os.open(lock_dir / f"gpu-{gpu}.lock", os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            held.append((gpu, fd))
            if len(held) == n:
                return [g for g, _ in held], [fd for _, fd in held]
        for _, fd in held:
            os.close(fd)
        if time.monotonic() > deadline:
            raise ValueError(f"with-gpus {n}: no {n} free GPU(s) among {','.join(gpus)} after {wait:g} s")
        time.sleep(1.0)


def cmd_with_gpus(args) -> int:
    command = [c for c in args.command if c != "--"] if args.command[:1] == ["--"] else args.command
    if not command:
        raise ValueError("with-gpus needs a command: petra with-gpus N -- COMMAND [ARGS...]")
    gpus, fds = claim(args.n, visible_gpus()) if args.n > 0 else ([], [])
    for fd in fds:
        os.set_inheritable(fd, True)  # COMMAND holds the claim until it exits
    os.execvpe(command[0], command, {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(gpus)})
    return 0  # not reached


def register(sub) -> None:
    p = sub.add_parser(
        "with-gpus",
        help="run a command on N GPUs no other `petra with-gpus` holds",
        description="Claim N free GPUs (lock files, released when the command exits), set "
        "CUDA_VISIBLE_DEVICES to them and run COMMAND. Used by the Snakemake train rule "
        "so that local runs share the machine's GPUs one each.",
    )
    p.add_argument("n", type=int, metavar="N", help="GPUs to claim (0: the command sees none)")
    p.add_argument("command", nargs="...", metavar="-- COMMAND", help="the command and its arguments")
    p.set_defaults(func=cmd_with_gpus)
