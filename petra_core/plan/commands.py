"""``petra plan``: predict, profile, search and validate (picked up by ``petra_core.cli``).

Every bad input is one line and exit status 2 (``PlanError`` is a ``ValueError``: the CLI's error
boundary, ``cli_errors.run_guarded``). Parsing imports nothing heavy; a sub-command imports what it
runs.
"""

from __future__ import annotations

import json
from pathlib import Path

GIB = 2**30


def _profile(args, *, method: str | None = None):
    """The profile ``--profile`` names (``measured``: measured now on this machine; a results/gpu
    ``stage_profile.json``: its row; else a profile JSON), checked against the model asked for."""
    from .cluster import PlanError
    from .profile import check_profile, load_profile
    from .profiling import from_stage_profile, measure_profile

    method = method or args.method
    if args.profile == "measured":
        p = measure_profile(args.model, method, batch=args.batch or 8, width=args.width, stem=args.stem, k=args.k)
    elif Path(args.profile).name == "stage_profile.json":
        p = from_stage_profile(args.profile, arch=args.model, method=method, settings=args.settings)
    else:
        p = load_profile(args.profile)
    check_profile(p, arch=args.model, width=args.width if args.profile == "measured" else None, stages=args.stages)
    if p.method != method:
        raise PlanError(
            f"profile ({p.provenance.get('source', args.profile)}) times method {p.method!r}, not {method!r}: "
            f"phases differ by method (a rebuild or not); profile {method} first"
        )
    if args.batch is not None and p.batch != args.batch:
        raise PlanError(f"profile is at batch {p.batch}, the plan asks for {args.batch}; allowed: --batch {p.batch}")
    return p


def _fmt_bytes(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def describe(pr) -> str:
    lines = [
        f"{pr.method}: {pr.stages} stages on {pr.devices} device(s) (split {pr.split}, {pr.replicas} replica(s), "
        f"k={pr.k}, batch {pr.batch} per replica)",
        f"  time per minibatch {1e3 * pr.seconds_per_minibatch:.2f} ms, {pr.samples_per_s:.1f} samples/s, "
        f"speedup {pr.speedup:.2f}x over one device ({1e3 * pr.one_device_seconds:.2f} ms), bubble "
        f"{100 * pr.bubble_fraction:.1f} %",
        f"  peak memory per device: {', '.join(_fmt_bytes(b) for b in pr.peak_bytes)}"
        + ("" if pr.fits is None else f" of {_fmt_bytes(pr.memory_bytes)}: {'fits' if pr.fits else 'does NOT fit'}"),
        f"  communication: {pr.link_bytes_per_minibatch / 1e6:.2f} MB over links per minibatch; replicas' "
        f"all-reduce {pr.allreduce_bytes_per_step / 1e6:.2f} MB per step and copy",
    ]
    if pr.seconds_per_epoch is not None:
        lines.append(f"  epoch of {pr.minibatches_per_epoch} minibatches: {pr.seconds_per_epoch:.1f} s")
    return "\n".join(lines)


def _write_json(path: str, obj) -> None:
    from ..run.runio import atomic_write

    text = json.dumps(obj, indent=1, default=str) + "\n"
    atomic_write(Path(path), lambda f: f.write(text.encode()))


def cmd_predict(args) -> int:
    from dataclasses import asdict

    from .cluster import load_cluster
    from .search import best_split, stage_costs
    from .simulate import parse_split, predict

    cluster = load_cluster(args.cluster)
    p = _profile(args)
    if args.split:
        placement = parse_split(args.split, p.num_stages)
    else:
        placement = best_split(stage_costs(p, args.k), args.devices or min(p.num_stages, cluster.devices))
    pr = predict(p, args.method, placement=placement, replicas=args.replicas, k=args.k, cluster=cluster,
                 minibatches_per_epoch=args.epoch_minibatches)  # fmt: skip
    print(describe(pr))
    print(f"  profile: {p.provenance}; cluster: {cluster.name} ({cluster.source})")
    if args.json:
        _write_json(args.json, dict(asdict(pr), cluster=cluster.name))
    return 0


def cmd_profile(args) -> int:
    from .profile import save_profile
    from .profiling import measure_profile

    p = measure_profile(args.model, args.method, batch=args.batch, width=args.width, stem=args.stem, k=args.k,
                        minibatches=args.minibatches, device=args.device)  # fmt: skip
    save_profile(p, args.out)
    total = sum(s.forward_s + s.rebuild_s + s.backward_s for s in p.stages)
    print(f"{args.out}: {p.num_stages} stages, {1e3 * total:.1f} ms of phases per minibatch on {p.device}")
    return 0


def cmd_search(args) -> int:
    from .cluster import load_cluster
    from .search import best_split, largest_revnet, min_devices, scan_devices, stage_costs
    from .simulate import format_split

    cluster = load_cluster(args.cluster)
    if args.what == "largest":
        for method in args.methods.split(","):
            best = largest_revnet(cluster, method, batch=args.batch or 64, stem=args.stem, k=args.k)
            if best is None:
                print(f"{method}: nothing fits")
                continue
            print(
                f"{method}: {best['arch']} width {best['width']} ({best['params'] / 1e6:.0f} M parameters), "
                f"split {best['split']} over {best['devices']} devices, peak {_fmt_bytes(best['peak_bytes'])}"
            )
        return 0
    p = _profile(args)
    if args.what == "min-devices":
        cap = args.memory_gib * GIB if args.memory_gib else cluster.memory_bytes
        found = min_devices(p, args.method, cap, k=args.k)
        if found is None:
            print(f"does not fit on any split over devices of {_fmt_bytes(cap)}")
        else:
            print(f"{found[0]} device(s) of {_fmt_bytes(cap)}: split {format_split(found[1])}")
    elif args.what == "split":
        split = best_split(stage_costs(p, args.k), args.devices or min(p.num_stages, cluster.devices))
        print(format_split(split))
    else:
        for pr in scan_devices(p, args.method, args.max_devices, k=args.k, cluster=cluster):
            print(f"{pr.devices:3d} devices (split {pr.split}, {pr.replicas} replica(s)): "
                  f"{1e3 * pr.seconds_per_minibatch:.2f} ms/minibatch, {pr.samples_per_s:.1f} samples/s")  # fmt: skip
    return 0


def _floats(text: str, what: str) -> list[float]:
    from .cluster import PlanError

    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise PlanError(f"{what} {text!r}: allowed: numbers separated by commas") from None


def _phase_ms(text: str) -> dict[str, float]:
    from .cluster import PlanError
    from .validate import PHASE_MS

    out = dict(PHASE_MS)
    for part in filter(None, text.split(",")):
        name, _, value = part.partition("=")
        if name not in out:
            raise PlanError(f"--phase-ms: unknown phase {name!r}; allowed: {', '.join(out)}")
        out[name] = _floats(value, f"--phase-ms {name}")[0]
    return out


def cmd_validate(args) -> int:
    from .validate import grid, validate

    points = grid(
        methods=args.methods.split(","), stages=[int(x) for x in _floats(args.stages, "--stages")],
        bandwidths=_floats(args.bandwidths, "--bandwidths"), latency=args.latency,
        replicas=[int(x) for x in _floats(args.replicas, "--replicas")],
        real_ranks=[int(x) for x in _floats(args.real_ranks, "--real-ranks")] if args.real_ranks else [],
    )  # fmt: skip
    real = dict(width=args.real_width, batch=args.real_batch, minibatches=args.real_minibatches)
    record = validate(points, arch=args.model, width=args.width, batch=args.batch or 8,
                      minibatches=args.minibatches, phase_ms=_phase_ms(args.phase_ms), real=real)  # fmt: skip
    if args.out:
        _write_json(args.out, record)
        print(args.out)
    return 0


def cmd_answers(args) -> int:
    from .answers import answers

    record = answers(args.profile, clusters=args.clusters.split(","), methods=args.methods.split(","),
                     settings=args.settings)  # fmt: skip
    _write_json(args.out, record)
    print(f"{args.out}: {len(record['rows'])} predictions, {len(record['fewest'])} fewest-device counts, "
          f"{len(record['largest'])} largest models; left out: {record['missing'] or 'nothing'}")  # fmt: skip
    return 0


def _model_args(p, *, profile: bool = True) -> None:
    p.add_argument("--model", default="revnet18", help="architecture (default %(default)s)")
    p.add_argument("--method", default="petra", help="training method (default %(default)s)")
    p.add_argument("--batch", type=int, help="minibatch per replica (default: the profile's; measuring: 8)")
    p.add_argument("--width", type=int, default=64, help="base width (default %(default)s)")
    p.add_argument("--stem", default="cifar", help="cifar (32x32, 10 classes) or imagenet (224x224, 1000)")
    p.add_argument("-k", "--k", type=int, default=1, help="accumulation (GPipe, 1F1B: microbatches per flush)")
    if profile:
        p.add_argument("--stages", type=int, help="stages J the plan expects (checked against the profile)")
        p.add_argument(
            "--profile",
            default="measured",
            help="a profile JSON (petra plan profile), a results/gpu/*/stage_profile.json, or 'measured' "
            "(measure now on this machine; default)",
        )
        p.add_argument("--settings", default="training", help="the stage_profile.json row's settings (training, bf16)")
        p.add_argument(
            "--cluster", default="cpu-box", help="a shipped cluster card or a card's YAML (default %(default)s)"
        )


def register(sub) -> None:
    plan = sub.add_parser(
        "plan",
        help="a calibrated cluster model: predict time, memory and devices of a run; validate it",
        description="Replay a method's action table on a cluster's devices and links from a device profile "
        "(docs/planning.md).",
    )
    psub = plan.add_subparsers(
        dest="plan_command", required=True, metavar="COMMAND", help="predict, profile, search, answers or validate"
    )

    p = psub.add_parser(
        "predict",
        help="time per minibatch and epoch, speedup, bubble, memory, communication",
        description="Predict one configuration: the profile's stages split over devices of the cluster, "
        "replayed as an event simulation of the method's action table.",
    )
    _model_args(p)
    p.add_argument("--split", help="stages per device, e.g. 0-3,4-9 (default: the fastest split)")
    p.add_argument("--devices", type=int, help="devices per pipeline for the fastest split (default: min(J, cluster))")
    p.add_argument("--replicas", type=int, default=1, help="data-parallel copies of the pipeline (default 1)")
    p.add_argument("--epoch-minibatches", type=int, help="minibatches per epoch (prints the epoch's time)")
    p.add_argument("--json", help="also write the prediction as JSON here")
    p.set_defaults(func=cmd_predict)

    p = psub.add_parser(
        "profile",
        help="measure a device profile on this machine (CPU or GPU) into a JSON file",
        description="Run the method a few minibatches on random data and time each stage's phases: on a CPU "
        "in the simulator, medians over the second half of the minibatches, with the bytes each stage kept; on "
        "a GPU with CUDA events that time each phase's kernels, bytes from the accounting (docs/planning.md).",
    )
    _model_args(p, profile=False)
    p.add_argument("--minibatches", type=int, default=24, help="minibatches run (default %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]: the device the phases are timed on")
    p.add_argument("--out", required=True, help="the profile JSON to write")
    p.set_defaults(func=cmd_profile, batch=8)

    p = psub.add_parser(
        "search",
        help="fewest devices, best split, largest RevNet, best per device count",
        description="min-devices: the fewest devices that hold the model under a memory cap; split: the "
        "fastest contiguous split; largest: the largest RevNet (depth x width) per method on the cluster; "
        "scan: the fastest pipeline x replicas for each device count.",
    )
    p.add_argument("what", choices=("min-devices", "split", "largest", "scan"), help="what to search")
    _model_args(p)
    p.add_argument("--memory-gib", type=float, help="memory cap per device (default: the cluster's)")
    p.add_argument("--devices", type=int, help="split: devices (default: min(J, cluster))")
    p.add_argument("--max-devices", type=int, default=64, help="scan: 1..N devices (default %(default)s)")
    p.add_argument("--methods", default="backprop,delayed,dsp,petra", help="largest: methods (comma-separated)")
    p.set_defaults(func=cmd_search)

    p = psub.add_parser(
        "answers",
        help="the reviewers' questions answered from committed profiles, as JSON",
        description="For RevNet18 CIFAR and RevNet50 ImageNet on each cluster: time per minibatch and epoch, "
        "speedup and memory per method and device count (best pipeline x replicas; one pipeline), the fewest "
        "devices at batch 256, the largest RevNet per method; each with its provenance.",
    )
    p.add_argument("--profile", default="results/gpu/nvidia-h200/stage_profile.json", help="the stage profile")
    p.add_argument("--settings", default="training", help="its rows' settings (default %(default)s)")
    p.add_argument("--clusters", default="h100-sxm-node,h200-sxm-node,8x1-100gbe", help="cluster cards")
    p.add_argument("--methods", default="backprop,delayed,dsp,petra,gpipe,1f1b", help="methods (comma-separated)")
    p.add_argument("--out", required=True, help="the JSON to write (atomically)")
    p.set_defaults(func=cmd_answers)

    p = psub.add_parser(
        "validate",
        help="predicted vs measured time per minibatch on emulated and real ranks",
        description="Run a grid of emulated multi-process points (and real gloo runs), predict each from the "
        "same phase times and link, print predicted vs measured and the mean and max error.",
    )
    p.add_argument("--model", default="revnet18", help="architecture of the runs (default %(default)s)")
    p.add_argument("--width", type=int, default=4, help="emulated runs' chain width (default %(default)s)")
    p.add_argument("--batch", type=int, default=8, help="emulated runs' minibatch (default %(default)s)")
    p.add_argument("--methods", default="backprop,delayed,dsp,petra,gpipe,1f1b", help="methods (comma-separated)")
    p.add_argument("--stages", default="2,4,6,10", help="J values (default %(default)s)")
    p.add_argument("--bandwidths", default="1e7,1e8", help="emulated link bandwidths, bytes/s (default %(default)s)")
    p.add_argument("--latency", type=float, default=5e-4, help="emulated link latency, s (default %(default)s)")
    p.add_argument("--replicas", default="1,2", help="replica counts (default %(default)s)")
    p.add_argument("--real-ranks", default="2,3", help="real gloo runs' rank counts ('' for none; default %(default)s)")
    p.add_argument("--minibatches", type=int, default=40, help="emulated runs' minibatches (default %(default)s)")
    p.add_argument("--real-width", type=int, default=32, help="real runs' chain width (default %(default)s)")
    p.add_argument("--real-batch", type=int, default=64, help="real runs' minibatch (default %(default)s)")
    p.add_argument("--real-minibatches", type=int, default=200, help="real runs' minibatches (default %(default)s)")
    p.add_argument("--phase-ms", default="", help="emulated phase times, e.g. forward=20,backward=40 (ms)")
    p.add_argument("--out", help="the JSON record to write (atomically)")
    p.set_defaults(func=cmd_validate)
