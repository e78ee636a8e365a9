"""Starting and ending the processes of a distributed run.

:func:`init_distributed` joins the process group from torchrun's environment; :func:`launch_local`
starts N ranks on this machine without torchrun and waits for them (tests, benchmarks;
:func:`start_local` only starts them: ``petra train --launch ranks`` waits itself, forwarding signals);
:func:`fail` ends a rank at once after a failure (no hanging in teardown).
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from .distributed.failures import DEFAULT_TIMEOUT, PipelineError


def local_gpu(local_rank: int, count: int) -> torch.device:
    """This node's GPU for ``LOCAL_RANK`` (never two ranks on one GPU by wrapping around)."""
    if not 0 <= local_rank < count:
        raise ValueError(
            f"LOCAL_RANK={local_rank} but {count} GPU(s) are visible on this node: launch at most "
            f"{count} rank(s) per node (torchrun --nproc-per-node={count}) or pass device=cpu"
        )
    return torch.device("cuda", local_rank)


def default_device(backend: str | None = None) -> torch.device:
    """``cuda:{LOCAL_RANK}`` when CUDA is available (and the backend is not gloo), else CPU."""
    if torch.cuda.is_available() and backend != "gloo":
        return local_gpu(int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count())
    return torch.device("cpu")


def init_distributed(
    backend: str | None = None, *, timeout: float = DEFAULT_TIMEOUT, device: torch.device | str | None = None
) -> torch.device:
    """Join the process group from the environment (torchrun's RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT, LOCAL_RANK) with a short timeout; returns this rank's device.

    ``backend`` defaults to NCCL when the device is a GPU, gloo otherwise. Does nothing but pick
    the device if the process group already exists.
    """
    device = torch.device(device) if device is not None else default_device(backend)
    if device.type == "cuda":
        if device.index is None:
            device = local_gpu(int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count())
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = backend or ("nccl" if device.type == "cuda" else "gloo")
        kwargs = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout), **kwargs)
    return device


def fail(err: BaseException, code: int = 1) -> None:
    """Print a pipeline failure to stderr and end the process at once (no hanging in teardown)."""
    print(
        str(err) if isinstance(err, PipelineError) else f"petra: {type(err).__name__}: {err}",
        file=sys.stderr,
        flush=True,
    )
    os._exit(code)


def rank_environment(rank: int, nprocs: int, port: int, env: dict | None = None) -> dict:
    """What torchrun gives rank ``rank`` of ``nprocs`` on this machine (store at 127.0.0.1:``port``)."""
    return dict(
        os.environ,
        **(env or {}),
        RANK=str(rank),
        WORLD_SIZE=str(nprocs),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(nprocs),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCHELASTIC_USE_AGENT_STORE="True",
    )


def capture_output(procs: list[subprocess.Popen]) -> list[threading.Thread]:
    """Read each process's stdout and stderr into ``.out`` and ``.err`` as it runs (no pipe fills up)."""
    readers = []
    for p in procs:
        p.out, p.err = "", ""
        for name in ("out", "err"):

            def read(p=p, name=name):
                setattr(p, name, getattr(p, "std" + name).read())

            readers.append(threading.Thread(target=read, daemon=True))
    for th in readers:
        th.start()
    return readers


def wait_for(procs: list[subprocess.Popen], timeout: float | None) -> None:
    """Wait until every process has exited, killing those still running after ``timeout`` seconds;
    each gets ``.ended`` (time.monotonic() when it exited)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    live = list(procs)
    while live:
        for p in list(live):
            if p.poll() is not None:
                p.ended = time.monotonic()
                live.remove(p)
        if live and deadline is not None and time.monotonic() > deadline:
            for p in live:
                p.kill()
                p.wait()
                p.ended = time.monotonic()
            break
        time.sleep(0.02)


def start_local(
    argv: Sequence[str],
    nprocs: int,
    *,
    timeout: float | None = None,
    env: dict | None = None,
    capture: bool = False,
    module: str = "petra_core.cli",
    script: str | None = None,
) -> tuple[dist.TCPStore, list[subprocess.Popen]]:
    """Start ``python -m MODULE ARGV`` (or ``python SCRIPT ARGV``) as ``nprocs`` ranks on 127.0.0.1;
    returns the rendezvous store this process hosts (keep it until the ranks have exited) and the
    processes. With ``capture`` their output is piped (see :func:`capture_output`)."""
    store = dist.TCPStore(
        "127.0.0.1", 0, nprocs, True, datetime.timedelta(seconds=max(timeout or 0, 600)), wait_for_workers=False
    )
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) if capture else {}
    program = [script] if script is not None else ["-m", module]
    procs = [
        subprocess.Popen(
            [sys.executable, *program, *argv], env=rank_environment(rank, nprocs, store.port, env), **pipes
        )
        for rank in range(nprocs)
    ]
    return store, procs


def launch_local(
    argv: Sequence[str],
    nprocs: int,
    *,
    timeout: float | None = None,
    env: dict | None = None,
    capture: bool = False,
    module: str = "petra_core.cli",
    script: str | None = None,
) -> list[subprocess.Popen]:
    """Run ``python -m MODULE ARGV`` (or ``python SCRIPT ARGV``) as ``nprocs`` ranks on 127.0.0.1 and
    wait for them.

    Like torchrun without its agent: this process hosts the rendezvous store (so it outlives any
    rank, as torchrun's does) and sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT;
    a failing rank is *not* killed by the launcher, the ranks stop each other. Processes still
    running after ``timeout`` seconds are killed. With ``capture`` each process gets ``.out`` and
    ``.err`` (its output); every process gets ``.ended`` (time.monotonic() when it exited).
    """
    store, procs = start_local(argv, nprocs, timeout=timeout, env=env, capture=capture, module=module, script=script)
    readers = capture_output(procs) if capture else []
    wait_for(procs, timeout)
    for th in readers:
        th.join(10)
    del store
    return procs
