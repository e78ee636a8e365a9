"""Time and memory of every method on one GPU: RevNet18 and RevNet50, CIFAR and ImageNet stems.

    python benchmarks/bench_gpu.py                           # appends rows to results/gpu/<GPU>.json
    python benchmarks/bench_gpu.py --device cpu --quick      # a smoke run of the script on CPU (tests)

One row per (model, stem, method, settings), written to the JSON as soon as it is measured (the
file is rewritten atomically after every row), so a run cut short keeps every row it finished:

* ``s_per_batch``: the synced wall time per minibatch in the pipeline's steady state, timed with
  CUDA events (perf_counter on CPU); ``host_s_per_tick``: the host's time to enqueue a tick
  (without waiting for the device): a row where it approaches the synced time is CPU-bound;
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
Ratios at the end: PETRA/backprop step time and PETRA/delayed peak memory, per model.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import tempfile
import time
from pathlib import Path

import torch

from petra_core import METHODS, Pipeline, Recipe, build_model
from petra_core.engine import LocalWorld, PipelineSpec
from petra_core.engine.host_memory import retain_freed_memory
from petra_core.engine.observers import Observer
from petra_core.precision import set_numerics

CONFIGS = [
    ("revnet18", "cifar", 32, 10),
    ("revnet18", "imagenet", 224, 1000),
    ("revnet50", "cifar", 32, 10),
    ("revnet50", "imagenet", 224, 1000),
]
# name -> (precision, deterministic), as petra_core.precision sets them; ``training`` is
# what ``petra train`` runs by default
SETTINGS = {"training": ("fp32", True), "fastest": ("tf32", False), "bf16": ("bf16", False)}


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


def measure(
    arch, stem, size, classes, method, *, device, width, batch, timed, inject_oom=False, devices=None, precision="fp32"
) -> dict:
    """One row: steady-state time and memory of ``method`` with every stage on ``device`` (or
    spread over ``devices`` in contiguous blocks)."""
    devices = devices or [device]
    torch.manual_seed(0)
    aux = "cnn" if METHODS[method].needs_aux else None
    model = build_model(arch, num_classes=classes, stem=stem, width=width, aux_head=aux)
    x = torch.randn(batch, 3, size, size)
    y = torch.randint(0, classes, (batch,))
    cuda = device.type == "cuda"
    if cuda:
        x, y = x.pin_memory(), y.pin_memory()
    J = len(model)
    per = 2 * J - 1 if METHODS[method].schedule.fixed_weights_in_flight else 1  # ticks per minibatch
    fill = 2 * (J - 1) + 1 if per == 1 else 1
    peak_ticks = per  # one minibatch's worth, after the timed ones
    n = fill + timed + 2 * J + 2  # minibatches: enough that the timed and peak ticks are all steady
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
        )
    )
    if inject_oom:  # the smoke test's stand-in for a real out-of-memory
        raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {2**40} bytes (injected)")
    pipe.run(fill * per)
    clock = Clock(device)
    if cuda:
        for d in devices:
            torch.cuda.synchronize(d)
            torch.cuda.reset_peak_memory_stats(d)
    host = 0.0
    start = clock.mark()
    for _ in range(timed * per):
        t0 = time.perf_counter()
        pipe.advance()
        host += time.perf_counter() - t0
    end = clock.mark()
    for d in devices[1:]:
        torch.cuda.synchronize(d)
    seconds = clock.seconds(start, end) / timed
    device_peak = max(torch.cuda.max_memory_allocated(d) for d in devices) if cuda else None
    stage_peaks = None
    if cuda and len(devices) == 1:
        observer = StagePeaks(device, J)
        pipe.observers.append(observer)
        pipe.run(peak_ticks)
        pipe.observers.remove(observer)
        stage_peaks = observer.peaks
    held = [
        sum(p.numel() * p.element_size() * 3 for p in w.params) + sum(w.storage.kept_bytes().values())
        for w in pipe.workers
    ]
    return {
        "stages": J,
        "devices": len(devices),
        "s_per_batch": seconds,
        "images_per_s": batch / seconds,
        "host_s_per_tick": host / (timed * per),
        "stage_peak_bytes": stage_peaks,
        "stage_held_bytes": held,
        "device_peak_bytes": device_peak,
    }


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


def ratios(rows: list[dict]) -> list[dict]:
    out = []
    for arch, stem, setting in dict.fromkeys((r["arch"], r["stem"], r["settings"]) for r in rows):
        same = {
            r["method"]: r
            for r in rows
            if (r["arch"], r["stem"], r["settings"]) == (arch, stem, setting)
            and not r.get("oom")
            and not r.get("error")
            and r.get("devices", 1) == 1
        }
        ratio = {"arch": arch, "stem": stem, "settings": setting}
        if "petra" in same and "backprop" in same:
            ratio["petra_over_backprop_step"] = same["petra"]["s_per_batch"] / same["backprop"]["s_per_batch"]
        if "petra" in same and "delayed" in same and same["petra"]["device_peak_bytes"]:
            ratio["petra_over_delayed_peak_memory"] = (
                same["petra"]["device_peak_bytes"] / same["delayed"]["device_peak_bytes"]
            )
        out.append(ratio)
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--timed", type=int, default=6, help="timed minibatches per row")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--configs", default="all", help="'all' or e.g. revnet18:cifar,revnet50:imagenet")
    p.add_argument(
        "--settings",
        default="training,fastest",
        help=f"comma-separated, of: {', '.join(SETTINGS)} (default %(default)s)",
    )
    p.add_argument("--quick", action="store_true", help="tiny shapes (a smoke run of the script)")
    p.add_argument("--inject-oom", default="", help="methods whose rows raise an out-of-memory (tests)")
    p.add_argument("--out", default="results/gpu", help="directory for the JSON")
    args = p.parse_args(argv)
    retain_freed_memory()  # as a run does (host_memory.py)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_gpu: no CUDA device visible (use --device cpu --quick to smoke-test the script)")
    bad = [x for x in args.settings.split(",") if x not in SETTINGS]
    if bad:
        raise SystemExit(f"bench_gpu: unknown setting {bad[0]!r}; allowed: {', '.join(SETTINGS)}")
    unknown = [m for m in args.methods.split(",") if m not in METHODS]
    if unknown:
        raise SystemExit(f"bench_gpu: unknown method {unknown[0]!r}; allowed: {', '.join(METHODS)}")
    configs = CONFIGS if args.configs == "all" else [c for c in CONFIGS if f"{c[0]}:{c[1]}" in args.configs.split(",")]
    if args.quick:
        configs, args.width, args.batch, args.timed = [("revnet18", "cifar", 16, 10)], 4, 4, 2
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or platform.machine()
    path = Path(args.out) / f"{re.sub(r'[^A-Za-z0-9]+', '-', name).strip('-').lower() or 'device'}.json"
    out = {
        "device": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "width": args.width,
        "batch": args.batch,
        "timed": args.timed,
        "rows": [],
        "ratios": [],
    }
    saved = current_settings()
    try:
        rows_for_every_setting(args, configs, device, path, out)
    finally:
        restore_settings(saved)
    print(json.dumps(out["ratios"], indent=1))
    print(f"wrote {path}")
    return out


def rows_for_every_setting(args, configs, device, path: Path, out: dict) -> None:
    for setting in args.settings.split(","):
        precision = apply_settings(setting)
        for arch, stem, size, classes in configs:
            for method in args.methods.split(","):
                row = {"arch": arch, "stem": stem, "image_size": size, "method": method, "settings": setting}
                t0 = time.perf_counter()
                try:
                    row.update(
                        measure(
                            arch,
                            stem,
                            size,
                            classes,
                            method,
                            device=device,
                            width=args.width,
                            batch=args.batch,
                            timed=args.timed,
                            precision=precision,
                            inject_oom=method in args.inject_oom.split(","),
                        )
                    )
                    what = (
                        f"{row['s_per_batch'] * 1e3:8.1f} ms/batch (host {row['host_s_per_tick'] * 1e3:.1f} ms/tick)"
                        f"  peak {(row['device_peak_bytes'] or 0) / 2**30:6.2f} GiB"
                    )
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
                print(f"{setting:8s} {arch:9s} {stem:8s} {method:12s} {what} ({row['bench_s']:.0f} s)", flush=True)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            if args.device == "cuda" and torch.cuda.device_count() >= 2 and "petra" in args.methods.split(","):
                gpus = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
                row = {
                    "arch": arch,
                    "stem": stem,
                    "image_size": size,
                    "method": "petra",
                    "settings": setting,
                    "devices": len(gpus),
                }
                try:
                    row.update(
                        measure(
                            arch,
                            stem,
                            size,
                            classes,
                            "petra",
                            device=gpus[0],
                            devices=gpus,
                            width=args.width,
                            batch=args.batch,
                            timed=args.timed,
                            precision=precision,
                        )
                    )
                except torch.cuda.OutOfMemoryError as err:
                    row.update(oom=True, tried_bytes=oom_bytes(err), error=str(err).splitlines()[0][:300])
                except Exception as err:  # noqa: BLE001
                    row.update(error=f"{type(err).__name__}: {err}"[:300])
                out["rows"].append(row)
                write_atomically(path, out)


if __name__ == "__main__":
    main()
