"""Time and memory of every method on one GPU against a plain PyTorch loop, and where the time goes.

    python benchmarks/bench_gpu.py                           # writes results/gpu/<GPU>.json
    python benchmarks/bench_gpu.py --device cpu --quick      # a smoke run of the script on CPU (tests)
    python benchmarks/bench_gpu.py --device cpu --width 8 --batches 64 --settings training \
        --methods backprop,petra                             # host Python calls per tick, on a CPU

Rows per (model, stem, settings, batch; ``--batches``, default 64 and 256): first ``plain``, a
plain PyTorch loop over the same model (``build_model``, same arch, width and stem): one module's
forward and backward, one optimizer over all of it (``make_optimizer``, the recipe every stage
of the engine gets: SGD, foreach on CUDA), the batch copied from pinned memory every step as the
engine's stage 0 does, in channels-last where the engine is (``--channels-last``, a run's
default), under the same precision settings (autocast for bf16); then each method, once per
``--phases`` value (how the engine runs a stage's phases; those the engine knows). Each row is
written to the JSON as soon as it is measured (the file is rewritten atomically after every row),
so a run cut short keeps every row it finished:

* ``s_per_batch``: the synced wall time per minibatch in the pipeline's steady state, timed with
  CUDA events (perf_counter on CPU); ``host_s_per_tick``: the host's time to enqueue a tick
  (without waiting for the device; plain: a step); ``host_s_per_batch`` the same per minibatch
  and ``host_over_synced`` = host ÷ synced per minibatch: a row near 1 is CPU-bound;
* ``host_calls_per_tick``: Python function calls the host makes per tick (``sys.setprofile``
  over a few steady ticks of their own; ``host_c_calls_per_tick``: calls of built-in and
  extension functions), a count that is the same on a noisy machine (benchmarks/host_calls.py);
* ``stage_host_ms`` and ``stage_device_ms``: per stage, ms per minibatch of each phase (forward,
  rebuild, backward, send, step) on the host and on the device, CUDA events around each phase
  with the launches hidden behind a sleep (benchmarks/phase_times.py; perf_counter on CPU), in
  ticks of their own (``stage_times_error`` instead, where the phases cannot be observed);
* ``stage_peak_bytes``: ``torch.cuda.max_memory_allocated`` while each stage runs a phase
  (measured in ticks of their own, after the timed ones, through the runner's observers, so the
  timed ticks carry no measurement); ``device_peak_bytes``: the device's peak over the timed
  ticks; ``stage_held_bytes``: what each stage holds between ticks (weights, gradients, momentum
  and what its method keeps);
* an out-of-memory is a result: the row says ``oom`` with the bytes the allocator reported;
* settings: ``training`` (what ``petra train`` runs by default: precision fp32 with TF32 off,
  deterministic algorithms), ``fastest`` (precision tf32, cuDNN benchmark mode, nondeterministic
  algorithms allowed) and ``bf16`` (bf16 autocast, otherwise as fastest); see
  petra_core/precision.py.

Methods that learn from auxiliary heads (local, fg-local-w, fg-local-a) get a model with CNN
heads. With 2 or more GPUs, PETRA also spread over all of them (stages in contiguous blocks).
Ratios at the end, per model, settings, batch and phases: PETRA/backprop step time, PETRA/delayed
peak memory, and every method's step time over plain's (``backprop_over_plain``,
``petra_over_plain``, ...).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import re
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from host_calls import count_calls
from phase_times import stage_phase_times

from petra_core import METHODS, Pipeline, Recipe, build_model
from petra_core.engine import LocalWorld, PipelineSpec
from petra_core.engine import spec as spec_module
from petra_core.engine.host_memory import retain_freed_memory
from petra_core.engine.observers import Observer
from petra_core.optim import make_optimizer
from petra_core.precision import compute, set_numerics
from petra_core.run.config import RunConfig

CONFIGS = [
    ("revnet18", "cifar", 32, 10),
    ("revnet18", "imagenet", 224, 1000),
    ("revnet50", "cifar", 32, 10),
    ("revnet50", "imagenet", 224, 1000),
]
# name -> (precision, deterministic), as petra_core.precision sets them; ``training`` is
# what ``petra train`` runs by default
SETTINGS = {"training": ("fp32", True), "fastest": ("tf32", False), "bf16": ("bf16", False)}
QUICK_SIZE = {"cifar": 16, "imagenet": 64}  # --quick: the smallest images each stem takes down to 1 x 1 or so
CALL_MINIBATCHES = 3  # steady minibatches whose host calls are counted (one for sequential methods: 2J - 1 ticks)


def current_settings() -> tuple:
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cuda.matmul.allow_tf32,
    )


def restore_settings(saved: tuple) -> None:
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    (
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cuda.matmul.allow_tf32,
    ) = saved[2:]


@contextlib.contextmanager
def kept_settings():
    """The process-wide flags a setting changes, restored on the way out whatever was set inside."""
    saved = current_settings()
    try:
        yield
    finally:
        restore_settings(saved)


def apply_settings(name: str) -> str:
    """Set the flags of setting ``name``; returns its precision (for the stages' compute)."""
    precision, deterministic = SETTINGS[name]
    set_numerics(precision, deterministic)
    return precision


class StagePeaks(Observer):
    """The device's allocation peak while each stage runs a phase (reset before, read after)."""

    def __init__(self, device, stages: int):
        self.device, self.peaks = device, [0] * stages

    def before(self, phase, worker, mb):
        if phase != "step":
            torch.cuda.reset_peak_memory_stats(self.device)

    def after(self, phase, worker, mb):
        if phase != "step":
            self.peaks[worker.index] = max(self.peaks[worker.index], torch.cuda.max_memory_allocated(self.device))


class Clock:
    """Synced seconds between two marks: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.device = device

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    def seconds(self, start, end) -> float:
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        return end - start


def inputs(batch: int, size: int, classes: int, cuda: bool, channels_last: bool):
    """One minibatch (images, labels) on the host, pinned for a GPU, as a run's prefetcher gives it."""
    x = torch.randn(batch, 3, size, size)
    y = torch.randint(0, classes, (batch,))
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    if cuda:
        x, y = x.pin_memory(), y.pin_memory()
    return x, y


def timed_steps(step, clock: Clock, steps: int, devices) -> tuple[float, float]:
    """(synced seconds, host seconds) of ``steps`` calls of ``step``: the host's time is the sum of
    the calls (it enqueues, it does not wait), the synced one from a mark before to a mark after."""
    if clock.cuda:
        for d in devices:
            torch.cuda.synchronize(d)
            torch.cuda.reset_peak_memory_stats(d)
    host = 0.0
    start = clock.mark()
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        host += time.perf_counter() - t0
    end = clock.mark()
    for d in devices[1:]:
        torch.cuda.synchronize(d)
    return clock.seconds(start, end), host


def measure_plain(
    arch, stem, size, classes, *, device, width, batch, timed, precision="fp32", channels_last=False
) -> dict:
    """The plain PyTorch loop's row: the same model in one module, one optimizer, one step per minibatch."""
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    model = build_model(arch, num_classes=classes, stem=stem, width=width).to(device)
    if channels_last:
        model.to(memory_format=torch.channels_last)
    x, y = inputs(batch, size, classes, cuda, channels_last)
    opt, sched = make_optimizer(model, Recipe(base_lr=0.01), batch_size=batch, k=1, steps_per_epoch=1000)

    def step():
        xb, yb = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with compute(precision, device):
            logits = model(xb)
        F.cross_entropy(logits.float(), yb).backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):  # warm-up: cuDNN's benchmark, the allocator
        step()
    synced, host = timed_steps(step, Clock(device), timed, [device])
    peak = torch.cuda.max_memory_allocated(device) if cuda else None
    calls = count_calls(step, CALL_MINIBATCHES)
    return {
        "stages": len(model),
        "devices": 1,
        "ticks_per_batch": 1,
        "s_per_batch": synced / timed,
        "images_per_s": batch * timed / synced,
        "host_s_per_tick": host / timed,
        "host_s_per_batch": host / timed,
        "host_over_synced": host / synced,
        "host_calls_per_tick": calls["python_calls"],
        "host_c_calls_per_tick": calls["c_calls"],
        "stage_peak_bytes": None,
        "stage_held_bytes": None,
        "device_peak_bytes": peak,
    }


def measure(
    arch,
    stem,
    size,
    classes,
    method,
    *,
    device,
    width,
    batch,
    timed,
    inject_oom=False,
    devices=None,
    precision="fp32",
    phases="eager",
    channels_last=False,
    stage_streams=False,
) -> dict:
    """One row: steady-state time and memory of ``method`` with every stage on ``device`` (or
    spread over ``devices`` in contiguous blocks), then, in ticks of their own, its host calls per
    tick, each stage's peak memory and each stage's time per phase."""
    devices = devices or [device]
    torch.manual_seed(0)
    aux = "cnn" if METHODS[method].needs_aux else None
    model = build_model(arch, num_classes=classes, stem=stem, width=width, aux_head=aux)
    if channels_last:
        model.to(memory_format=torch.channels_last)
    cuda = device.type == "cuda"
    x, y = inputs(batch, size, classes, cuda, channels_last)
    J = len(model)
    per = 2 * J - 1 if METHODS[method].schedule.fixed_weights_in_flight else 1  # ticks per minibatch
    fill = 2 * (J - 1) + 1 if per == 1 else 1
    calls_ticks = per * (CALL_MINIBATCHES if per == 1 else 1)
    # minibatches: enough that the timed ticks and those of their own (calls, peaks, two phase passes) are steady
    n = fill + timed + CALL_MINIBATCHES + 3 + 2 * J + 2
    pipe = Pipeline.build(
        PipelineSpec(
            model=model,
            method=method,
            world=LocalWorld(devices=devices if cuda else None),
            num_batches=n,
            get_batch=lambda mb: (x, y),
            batch_size=batch,
            recipe=Recipe(base_lr=0.01),
            precision=precision,
            **({} if phases == "eager" else {"phases": phases}),  # a spec without the field runs eager
            **({"stage_streams": True} if stage_streams else {}),
        )
    )
    if inject_oom:  # the smoke test's stand-in for a real out-of-memory
        raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {2**40} bytes (injected)")
    pipe.run(fill * per)
    synced, host = timed_steps(pipe.advance, Clock(device), timed * per, devices)
    device_peak = max(torch.cuda.max_memory_allocated(d) for d in devices) if cuda else None
    calls = count_calls(pipe.advance, calls_ticks)
    replayed = count_calls(pipe.advance, calls_ticks, skip=phase_computes()) if phases != "eager" else calls
    stage_peaks = None
    if cuda and len(devices) == 1:
        observer = StagePeaks(device, J)
        pipe.observers.append(observer)
        pipe.run(per)  # one minibatch's worth
        pipe.observers.remove(observer)
        stage_peaks = observer.peaks
    try:  # a way of running phases that observers cannot watch must not lose the row's times
        phase_ms = stage_phase_times(pipe, per, 1)
    except Exception as err:  # noqa: BLE001
        phase_ms = {"stage_times_error": f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"}
    held = [
        sum(p.numel() * p.element_size() * 3 for p in w.params) + sum(w.storage.kept_bytes().values())
        for w in pipe.workers
    ]
    return {
        "stages": J,
        "devices": len(devices),
        "ticks_per_batch": per,
        "s_per_batch": synced / timed,
        "images_per_s": batch * timed / synced,
        "host_s_per_tick": host / (timed * per),
        "host_s_per_batch": host / timed,
        "host_over_synced": host / synced,
        "host_calls_per_tick": calls["python_calls"],
        "host_c_calls_per_tick": calls["c_calls"],
        # a static phase's compute counted as the one call a graph replay makes of it: a tick's host
        # calls once every phase is replayed (what phases=graphs leaves, measured without a GPU)
        "host_calls_per_tick_replayed": replayed["python_calls"],
        "host_c_calls_per_tick_replayed": replayed["c_calls"],
        "stage_peak_bytes": stage_peaks,
        "stage_held_bytes": held,
        "device_peak_bytes": device_peak,
        **phase_ms,
    }


def runs_with(methods: list[str], phases: str) -> list[str]:
    """The methods that run with ``phases`` (static phases run those whose stages keep their input
    or nothing: engine/phases.py); the others are measured eager only."""
    if phases == "eager":
        return methods
    from petra_core.engine.phases import static_methods

    return [m for m in methods if m in static_methods()]


def phase_computes() -> tuple:
    """The compute of each static phase (engine/phases.py), what one CUDA graph replay stands for."""
    try:
        from petra_core.engine.phases import StaticPhases
    except ImportError:  # an engine without static phases
        return ()
    return (StaticPhases._forward, StaticPhases._backward, StaticPhases._step)


def oom_bytes(err: BaseException) -> int | None:
    """The bytes the allocator tried to hold, from its message (None if it does not say)."""
    m = re.search(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB|bytes)", str(err))
    if not m:
        return None
    scale = {"B": 1, "bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}[m.group(2)]
    return int(float(m.group(1)) * scale)


def write_atomically(path: Path, out: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def _usable(r: dict) -> bool:
    return not r.get("oom") and not r.get("error") and r.get("devices", 1) == 1


def ratios(rows: list[dict]) -> list[dict]:
    """Per (model, stem, settings, batch, phases): PETRA/backprop step time, PETRA/delayed peak
    memory, and each method's step time over the plain loop's (same model, settings and batch)."""
    out = []
    groups = dict.fromkeys(
        (r["arch"], r["stem"], r["settings"], r.get("batch"), r.get("phases", "eager"))
        for r in rows
        if r["method"] != "plain"
    )
    for arch, stem, setting, batch, phases in groups:
        model = (arch, stem, setting, batch)
        same = {
            r["method"]: r
            for r in rows
            if (r["arch"], r["stem"], r["settings"], r.get("batch")) == model
            and r.get("phases", "eager") == phases
            and r["method"] != "plain"
            and _usable(r)
        }
        plain = next(
            (
                r
                for r in rows
                if r["method"] == "plain"
                and _usable(r)
                and (r["arch"], r["stem"], r["settings"], r.get("batch")) == model
            ),
            None,
        )
        ratio = {"arch": arch, "stem": stem, "settings": setting, "batch": batch, "phases": phases}
        if "petra" in same and "backprop" in same:
            ratio["petra_over_backprop_step"] = same["petra"]["s_per_batch"] / same["backprop"]["s_per_batch"]
        if "petra" in same and "delayed" in same and same["petra"]["device_peak_bytes"]:
            ratio["petra_over_delayed_peak_memory"] = (
                same["petra"]["device_peak_bytes"] / same["delayed"]["device_peak_bytes"]
            )
        for method, r in same.items() if plain else ():
            ratio[f"{method}_over_plain"] = r["s_per_batch"] / plain["s_per_batch"]
        out.append(ratio)
    return out


def comma_list(text: str, allowed, what: str) -> list[str]:
    """``text``'s comma-separated names, each one of ``allowed`` (else one line naming the bad one)."""
    names = [x for x in text.split(",") if x]
    bad = [x for x in names if x not in allowed]
    if bad or not names:
        raise SystemExit(f"bench_gpu: unknown {what} {(bad or [text])[0]!r}; allowed: {', '.join(allowed)}")
    return names


def batch_sizes(text: str) -> list[int]:
    sizes = [x for x in text.split(",") if x]
    bad = [x for x in sizes if not x.isdigit() or int(x) < 1]
    if bad or not sizes:
        raise SystemExit(f"bench_gpu: batch size {(bad or [text])[0]!r} is not allowed; allowed: integers >= 1")
    return [int(x) for x in sizes]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batches", default="64,256", help="minibatch sizes, comma-separated (default %(default)s)")
    p.add_argument("--timed", type=int, default=6, help="timed minibatches per row")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--configs", default="all", help="'all' or e.g. revnet18:cifar,revnet50:imagenet")
    p.add_argument(
        "--settings",
        default="training,fastest",
        help=f"comma-separated, of: {', '.join(SETTINGS)} (default %(default)s)",
    )
    p.add_argument(
        "--phases",
        default="eager",
        help="how the engine runs a stage's phases, comma-separated, of: "
        f"{', '.join(getattr(spec_module, 'PHASES', ('eager',)))} (default %(default)s)",
    )
    p.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=RunConfig().channels_last,
        help="model and data of every row in channels-last memory format (default: a run's default, %(default)s)",
    )
    p.add_argument("--no-plain", dest="plain", action="store_false", help="skip the plain PyTorch loop's rows")
    p.add_argument(
        "--stage-streams",
        action="store_true",
        help="also PETRA with a CUDA stream per stage (engine/stage_streams.py), rows labelled PHASES+streams",
    )
    p.add_argument("--quick", action="store_true", help="tiny shapes (a smoke run of the script)")
    p.add_argument("--inject-oom", default="", help="methods whose rows raise an out-of-memory (tests)")
    p.add_argument("--out", default="results/gpu", help="directory for the JSON")
    return p


def main(argv=None) -> dict:
    args = parser().parse_args(argv)
    retain_freed_memory()  # as a run does (host_memory.py)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_gpu: no CUDA device visible (use --device cpu --quick to smoke-test the script)")
    args.settings = comma_list(args.settings, SETTINGS, "setting")
    args.methods = comma_list(args.methods, METHODS, "method")
    args.phases = comma_list(args.phases, getattr(spec_module, "PHASES", ("eager",)), "phases")
    args.batches = batch_sizes(args.batches)
    configs = CONFIGS if args.configs == "all" else [c for c in CONFIGS if f"{c[0]}:{c[1]}" in args.configs.split(",")]
    if args.quick:
        configs = configs if args.configs != "all" else CONFIGS[:1]
        configs = [(arch, stem, QUICK_SIZE[stem], classes) for arch, stem, _, classes in configs]
        args.width, args.batches, args.timed = 4, [4], 2
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or platform.machine()
    path = Path(args.out) / f"{re.sub(r'[^A-Za-z0-9]+', '-', name).strip('-').lower() or 'device'}.json"
    out = {
        "device": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "width": args.width,
        "batch": args.batches[0],  # the first of ``batches``; every row says its own
        "batches": args.batches,
        "phases": args.phases,
        "channels_last": args.channels_last,
        "timed": args.timed,
        "rows": [],
        "ratios": [],
    }
    with kept_settings():
        rows_for_every_setting(args, configs, device, path, out)
    print(json.dumps(out["ratios"], indent=1))
    print(f"wrote {path}")
    return out


def _replayed(row: dict) -> str:
    replayed = row.get("host_calls_per_tick_replayed")
    if replayed is None or row.get("phases", "eager") == "eager":
        return ""
    return f", {replayed:.0f} with each phase one replay"


def describe(row: dict) -> str:
    """One line of what a row measured."""
    return (
        f"{row['s_per_batch'] * 1e3:8.1f} ms/batch (host {row['host_s_per_batch'] * 1e3:.1f} ms,"
        f" host/synced {row['host_over_synced']:.2f}, {row['host_calls_per_tick']:.0f} Python calls/tick"
        f"{_replayed(row)})"
        f"  peak {(row['device_peak_bytes'] or 0) / 2**30:6.2f} GiB"
    )


def record(out: dict, path: Path, row: dict, measured) -> None:
    """``row`` with what ``measured()`` returns (an out-of-memory or an error is a result too),
    appended to ``out`` and written at once: a run cut short keeps every row it finished."""
    t0 = time.perf_counter()
    try:
        row.update(measured())
        what = describe(row)
    except torch.cuda.OutOfMemoryError as err:
        row.update(oom=True, tried_bytes=oom_bytes(err), error=str(err).splitlines()[0][:300])
        what = f"out of memory (tried {row['tried_bytes']} bytes)"
    except Exception as err:  # noqa: BLE001 - one failed row must not lose the others
        row.update(error=f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}")
        what = f"failed: {row['error']}"
    row["bench_s"] = time.perf_counter() - t0
    out["rows"].append(row)
    out["ratios"] = ratios(out["rows"])
    write_atomically(path, out)
    where = f"{row['settings']:8s} {row['arch']:9s} {row['stem']:8s} b{row['batch']:<4d}"
    print(f"{where} {row['method']:12s} {row['phases']:7s} {what} ({row['bench_s']:.0f} s)", flush=True)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def rows_for_every_setting(args, configs, device, path: Path, out: dict) -> None:
    gpus = [torch.device("cuda", i) for i in range(torch.cuda.device_count())] if args.device == "cuda" else []
    for setting in args.settings:
        precision = apply_settings(setting)
        for arch, stem, size, classes in configs:
            for batch in args.batches:
                model = (arch, stem, size, classes)
                shape = dict(device=device, width=args.width, batch=batch, timed=args.timed, precision=precision)
                shape["channels_last"] = args.channels_last
                key = {"arch": arch, "stem": stem, "image_size": size, "batch": batch, "settings": setting}
                if args.plain:
                    row = {**key, "method": "plain", "phases": "eager"}
                    record(out, path, row, functools.partial(measure_plain, *model, **shape))
                for phases in args.phases:
                    for method in runs_with(args.methods, phases):
                        oom = method in args.inject_oom.split(",")
                        measured = functools.partial(measure, *model, method, phases=phases, inject_oom=oom, **shape)
                        record(out, path, {**key, "method": method, "phases": phases}, measured)
                    if args.stage_streams and gpus and "petra" in runs_with(args.methods, phases):
                        row = {**key, "method": "petra", "phases": f"{phases}+streams", "stage_streams": True}
                        measured = functools.partial(
                            measure, *model, "petra", phases=phases, stage_streams=True, **shape
                        )
                        record(out, path, row, measured)
                    if len(gpus) >= 2 and "petra" in args.methods:
                        row = {**key, "method": "petra", "phases": phases, "devices": len(gpus)}
                        measured = functools.partial(measure, *model, "petra", phases=phases, devices=gpus, **shape)
                        record(out, path, row, measured)


if __name__ == "__main__":
    main()
