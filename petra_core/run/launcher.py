"""How ``petra train`` runs: in this one process, or as one rank per GPU that it starts itself.

Stages spread over several GPUs of one process are driven by one Python thread, so J GPUs can
never be faster than the sum of the stages' host times. On a box with G > 1 GPUs ``petra train``
therefore starts G ranks (the distributed runtime on NCCL, each rank pinned to its GPU by
``LOCAL_RANK``), so each host thread drives only its own stages. :func:`plan_launch` is the
decision, a pure function of the visible devices and the request (``--launch``, ``--ranks``);
:func:`run_ranks` starts the ranks, forwards SIGINT/SIGTERM to them (each rank then checkpoints
and stops at the same tick, as under torchrun) and returns their exit status. The same path runs
on CPU with gloo (``device=cpu --ranks N``): that is how it is tested.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass

from .config import ConfigError

LAUNCHES = ("auto", "process", "ranks")


@dataclass(frozen=True)
class LaunchPlan:
    """``ranks`` == 0: train in this process (the simulator, or one rank of a torchrun launch);
    otherwise start that many local ranks (``runtime=distributed``). ``note``: one line worth
    saying (fewer ranks than GPUs, and why), or None."""

    ranks: int
    note: str | None = None


def plan_launch(
    launch: str,
    ranks: int | None,
    *,
    device: str,
    gpus: int,
    stages: int,
    replicas: int = 1,
    under_torchrun: bool = False,
) -> LaunchPlan:
    """The launch of one ``petra train``. ``launch``: auto (ranks when ``device`` is cuda and
    ``gpus`` > 1, or when ``ranks`` is given), process (this process only) or ranks; ``ranks``: how
    many (default: one per visible GPU; required on cpu). The ranks hold ``replicas`` copies of a
    pipeline of ``stages`` stages: a launch that asks for more pipeline positions than stages is
    refused, auto uses fewer GPUs and says so. Bad requests raise :class:`ConfigError`, one line."""
    if launch not in LAUNCHES:
        raise ConfigError(f"--launch {launch!r} is not allowed; allowed: {', '.join(LAUNCHES)}")
    if ranks is not None and ranks < 1:
        raise ConfigError(f"--ranks {ranks} must be >= 1")
    if ranks is not None and launch == "process":
        raise ConfigError(f"--ranks {ranks} starts ranks but --launch process trains in this process; drop one")
    if under_torchrun:
        if launch == "ranks" or ranks is not None:
            raise ConfigError(
                "--launch ranks / --ranks inside a torchrun launch (WORLD_SIZE is set): torchrun already "
                "started the ranks; drop them"
            )
        return LaunchPlan(0)
    if launch == "process" or (launch == "auto" and ranks is None and (device != "cuda" or gpus < 2)):
        return LaunchPlan(0)
    if device != "cuda":
        if ranks is None:
            raise ConfigError("--launch ranks on device=cpu needs --ranks N (gloo ranks on this machine)")
        return _fitted(ranks, stages, replicas, explicit=True)
    if gpus < 1:
        raise ConfigError("--launch ranks with device=cuda: no GPU is visible; use device=cpu --ranks N")
    if ranks is not None and ranks > gpus:
        raise ConfigError(f"--ranks {ranks} needs {ranks} GPUs (one rank per GPU), {gpus} visible")
    return _fitted(ranks or gpus, stages, replicas, explicit=ranks is not None or launch == "ranks")


def _fitted(n: int, stages: int, replicas: int, *, explicit: bool) -> LaunchPlan:
    """``n`` ranks as replicas × positions with at most one position per stage: an explicit count
    must fit, one taken from the GPUs is cut down to fit (0: fewer than two ranks, run here)."""
    fits = n % replicas == 0 and n // replicas <= stages
    if explicit:
        if n % replicas:
            raise ConfigError(f"{n} ranks for replicas={replicas}: the ranks must be a multiple of the replicas")
        if not fits:
            raise ConfigError(
                f"{n} ranks hold {n // replicas} pipeline positions per replica but the model has {stages} "
                f"stages; use at most {replicas * stages} ranks"
            )
        return LaunchPlan(n)
    if fits:
        return LaunchPlan(n)
    used = min(n // replicas, stages) * replicas
    if used < 2:
        return LaunchPlan(0, f"{n} GPUs visible, replicas={replicas}: training in this process")
    return LaunchPlan(
        used, f"using {used} of {n} GPUs: {replicas} replica(s) of {stages} stages, at most one rank per stage"
    )


def exit_status(codes: Sequence[int]) -> int:
    """The launch's exit status from its ranks': 0 when all succeeded, else the first failing
    rank's (a rank killed by signal S: 128 + S, the shell's convention)."""
    for code in codes:
        if code:
            return 128 - code if code < 0 else code
    return 0


def run_ranks(argv: Sequence[str], nprocs: int, *, env: dict | None = None) -> int:
    """Run ``python -m petra_core.cli ARGV`` as ``nprocs`` local ranks and wait for them. SIGINT and
    SIGTERM received here are passed on to every rank (each stops at a tick boundary with a
    checkpoint; a rank that already got the terminal's Ctrl-C just sees it twice). Returns
    :func:`exit_status` of the ranks."""
    from ..engine.launch import start_local, wait_for

    store, procs = start_local(argv, nprocs, env=env)

    def forward(signum, frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        wait_for(procs, None)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        del store
    return exit_status([p.returncode for p in procs])


def stage_count(arch: str, width: int | None = None, **options) -> int:
    """The stages of ``arch`` built with ``width`` (unset: its own) and its family's other ``options``
    (on the meta device: no memory, no initialisation)."""
    import torch

    from ..families import build

    if width is not None:
        options["width"] = width
    with torch.device("meta"):
        return len(build(arch, num_classes=2, **options))
