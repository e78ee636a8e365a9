#!/usr/bin/env bash
# The one prepared script for a lent GPU: everything it measures goes into one archive under $OUT,
# each part under its own timeout, so one failure cannot take the rest down. Fits in 9 minutes on one GPU.
#
#   OUT=/tmp/out bash benchmarks/gpu_first_contact.sh            # on the GPU machine (the device tool sets $OUT)
#   OUT=/tmp/out DEVICE=cpu QUICK=1 bash benchmarks/gpu_first_contact.sh   # a smoke run of the script on CPU
#
# It runs with the project's .venv where there is one, else with the machine's own python3 and torch
# (PYTHONPATH at the project root; PYTHON overrides both). Every part logs to <part>.log; status.tsv:
# part, exit code (or skipped), seconds. At the end everything it wrote is packed into
# OUT/first_contact.tar.gz (run checkpoints left out), so a remote GPU box returns one file; only the
# archive and OUT/status.tsv stay under OUT.
# Parts, in this order (the most wanted first; BUDGET, default 530 s, caps them all together):
#   env            GPU, driver, CUDA, cuDNN, NCCL versions, torch's view of the devices, the engine's phases
#   bench          bench_gpu.py, RevNet18 CIFAR at batches 64 and 256, settings training, fastest and bf16:
#                  the plain PyTorch loop, backprop and PETRA for every --phases the engine knows
#                  (eager, static, graphs; graphs on CUDA only): time, host ÷ synced, host calls per
#                  tick, per-stage phase times                                          -> bench/*.json
#   bench_streams  bench_gpu.py, PETRA bf16 batch 64 with a CUDA stream per stage (stage_streams), for
#                  every --phases                                                     -> bench_streams/*.json
#   cifar10_*      real CIFAR-10: `petra prepare cifar10` from ../shared/data/cifar10-jpeg.tar.gz (or
#                  shared/data/ under the project root), then one epoch of backprop, of PETRA, and of
#                  PETRA with phases=graphs (`petra train dataset=cifar10 epochs=1`, bf16 by default on
#                  cuda; images/s in each run's metrics.json)                 -> cifar10/<method>[_graphs]/
#   bench_imagenet bench_gpu.py, RevNet50 ImageNet at batches 64 and 256, settings fastest and bf16,
#                  plain, backprop and PETRA                                          -> bench_imagenet/*.json
#   precision      PETRA's reconstruction error per stage under fp32, TF32 and bf16   -> precision/*.json
#   resume         a 2-epoch synthetic `petra train device=cuda` stopped by SIGTERM and resumed -> resume/run
#   train_bf16     the same run for one epoch at precision=bf16                       -> bf16/run
#   gpu_tests      pytest -m gpu with a junit report                                  -> gpu_tests.xml
#   loader         bench_loader.py on synthetic data (what the data layer makes, pinned)
#   cifar10_delayed, cifar10_dsp   one more real CIFAR-10 epoch each, with what is left of the budget
# QUICK=1 shrinks every part (tiny shapes; CIFAR-10 epochs on a 256-image subset at width 8).
set -u
OUT=${OUT:?set OUT to the directory the results go to}
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # (a relative OUT is the caller's)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the machine's own torch runs the project from here
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
RESULTS="$OUT/first_contact"  # what the parts write; packed into $OUT/first_contact.tar.gz at the end
rm -rf "$RESULTS" "$OUT/first_contact.tar.gz"
mkdir -p "$RESULTS"
printf 'part\texit\tseconds\n' > "$OUT/status.tsv"
SCRATCH=$(mktemp -d)  # the prepared dataset: not a result, not packed
trap 'rm -rf "$SCRATCH"' EXIT

BUDGET=${BUDGET:-530}  # seconds for the whole script: no part runs past it (the lease is short)

skip() {  # skip NAME WHY
    printf '%s\t%s\t%s\n' "$1" skipped 0 >> "$OUT/status.tsv"
    echo "first contact: $1 skipped: $2"
}

part() {  # part NAME TIMEOUT_S COMMAND...  (the timeout is cut to what is left of BUDGET)
    local name=$1 limit=$2; shift 2
    local start=$SECONDS left=$((BUDGET - SECONDS))
    if [ "$left" -lt 15 ]; then
        skip "$name" "the ${BUDGET} s budget is spent"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    timeout --kill-after=10 "$limit" "$@" > "$RESULTS/$name.log" 2>&1
    local code=$?
    printf '%s\t%s\t%s\n' "$name" "$code" "$((SECONDS - start))" >> "$OUT/status.tsv"
    echo "first contact: $name exited $code after $((SECONDS - start)) s"
}

# the engine's ways of running a stage's phases (petra_core.engine.spec.PHASES; eager only before it
# existed); captured CUDA graphs need CUDA
PHASES=$("$PY" -c 'import sys
from petra_core.engine import spec
print(",".join(p for p in getattr(spec, "PHASES", ("eager",)) if p != "graphs" or sys.argv[1] == "cuda"))' "$DEVICE" 2>/dev/null) || PHASES=eager
echo "first contact: phases $PHASES"

part env 60 "$PY" - "$RESULTS/env.json" "$PHASES" <<'PYEOF'
import json, platform, subprocess, sys
import torch
info = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
        "cuda_available": torch.cuda.is_available(), "platform": platform.platform(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "phases": sys.argv[2].split(",")}
try:
    info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                         "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
except (OSError, subprocess.TimeoutExpired) as err:
    info["nvidia_smi"] = f"unavailable: {err}"
open(sys.argv[1], "w").write(json.dumps(info, indent=1) + "\n")
print(json.dumps(info, indent=1))
PYEOF

# the most wanted numbers first: a part cut short by the budget loses the least (each row is written as it ends)
if [ -n "$QUICK" ]; then
    BENCH=(--device "$DEVICE" --quick --phases "$PHASES")
    part bench 120 "$PY" benchmarks/bench_gpu.py "${BENCH[@]}" --settings training,bf16 --out "$RESULTS/bench"
else
    BENCH=(--device "$DEVICE" --batches 64,256 --methods backprop,petra --phases "$PHASES")
    part bench 150 "$PY" benchmarks/bench_gpu.py "${BENCH[@]}" --configs revnet18:cifar \
        --settings training,fastest,bf16 --out "$RESULTS/bench"
fi

# PETRA with a CUDA stream per stage (its stages' kernels of a tick may overlap on the one GPU)
if [ "$DEVICE" = cuda ]; then
    part bench_streams 60 "$PY" benchmarks/bench_gpu.py --device cuda --batches 64 --methods petra --no-plain \
        --phases "$PHASES" --stage-streams --configs revnet18:cifar --settings bf16 --out "$RESULTS/bench_streams"
fi

# one real CIFAR-10 epoch per method, on the device (the tarball is never part of the project)
CIFAR=""
for tarball in ../shared/data/cifar10-jpeg.tar.gz shared/data/cifar10-jpeg.tar.gz; do
    [ -f "$tarball" ] && CIFAR=$tarball && break
done
CIFAR_RUN=(dataset=cifar10 "data_dir=$SCRATCH/prepared" epochs=1 "device=$DEVICE" progress=false)
if [ -n "$QUICK" ]; then
    CIFAR_RUN+=(subset=256 width=8 batch_size=32)
else
    CIFAR_RUN+=(width=64 batch_size=64)
fi
cifar_epoch() {  # cifar_epoch NAME TIMEOUT_S KEY=VALUE...  (NAME: the method, or METHOD_graphs)
    local name=$1 limit=$2
    shift 2
    if [ -z "$CIFAR" ]; then
        skip "cifar10_$name" "no CIFAR-10 tarball at ../shared/data/cifar10-jpeg.tar.gz or shared/data/cifar10-jpeg.tar.gz"
    elif [ ! -f "$SCRATCH/prepared/cifar10/manifest.json" ]; then
        skip "cifar10_$name" "petra prepare cifar10 did not finish (cifar10_prepare.log)"
    else
        part "cifar10_$name" "$limit" "$PY" -m petra_core.cli train "${CIFAR_RUN[@]}" "$@" \
            --run-dir "$RESULTS/cifar10/$name"
    fi
}
if [ -n "$CIFAR" ]; then
    part cifar10_prepare 90 "$PY" -m petra_core.cli prepare cifar10 --source "$CIFAR" --out "$SCRATCH/prepared/cifar10"
else
    skip cifar10_prepare "no CIFAR-10 tarball at ../shared/data/cifar10-jpeg.tar.gz or shared/data/cifar10-jpeg.tar.gz"
fi
cifar_epoch backprop 90 method=backprop
cifar_epoch petra 100 method=petra
if [ "$DEVICE" = cuda ]; then
    cifar_epoch petra_graphs 100 method=petra phases=graphs
fi

if [ -n "$QUICK" ]; then
    part bench_imagenet 120 "$PY" benchmarks/bench_gpu.py "${BENCH[@]}" --configs revnet50:imagenet \
        --methods backprop,petra --settings fastest --out "$RESULTS/bench_imagenet"
else
    part bench_imagenet 170 "$PY" benchmarks/bench_gpu.py "${BENCH[@]}" --configs revnet50:imagenet --timed 4 \
        --settings fastest,bf16 --out "$RESULTS/bench_imagenet"
fi

if [ -n "$QUICK" ]; then
    part precision 120 "$PY" benchmarks/bench_precision.py --device "$DEVICE" --archs revnet18 --width 8 --out "$RESULTS/precision"
else
    part precision 120 "$PY" benchmarks/bench_precision.py --device "$DEVICE" --out "$RESULTS/precision"
fi

# a short run on the device, stopped by SIGTERM after its first epoch's checkpoint, then resumed
RUN="$RESULTS/resume/run"
TRAIN=(train dataset=synthetic synthetic_train=512 synthetic_test=128 batch_size=32 epochs=2 width=8
       method=petra "device=$DEVICE" progress=false --run-dir "$RUN")
part resume_interrupted 90 "$PY" -m petra_core.cli "${TRAIN[@]}" --fault-at 0:20:SIGTERM
part resume_finished 90 "$PY" -m petra_core.cli "${TRAIN[@]}"
# the same run at bf16 (autocast; weights and messages float32): does PETRA still train?
part train_bf16 60 "$PY" -m petra_core.cli train dataset=synthetic synthetic_train=512 synthetic_test=128 \
    batch_size=32 epochs=1 width=8 method=petra precision=bf16 "device=$DEVICE" progress=false --run-dir "$RESULTS/bf16/run"

[ "$DEVICE" = cuda ] && part gpu_tests 150 "$PY" -m pytest -q -m gpu --junitxml="$RESULTS/gpu_tests.xml" tests/

LOADER_BATCHES=300
[ -n "$QUICK" ] && LOADER_BATCHES=30
part loader 60 "$PY" benchmarks/bench_loader.py --dataset synthetic --batches "$LOADER_BATCHES"

# more methods on real data, with what is left
cifar_epoch delayed 90 method=delayed
cifar_epoch dsp 90 method=dsp

# one archive of everything the parts wrote (with status.tsv as it stands), so a remote box returns one file
cp "$OUT/status.tsv" "$RESULTS/status.tsv"
if tar -czf "$OUT/first_contact.tar.gz.tmp" -C "$OUT" --exclude='checkpoint*' first_contact \
    && mv "$OUT/first_contact.tar.gz.tmp" "$OUT/first_contact.tar.gz"; then
    rm -rf "$RESULTS"
    echo "first contact: done; $OUT/first_contact.tar.gz ($(du -k "$OUT/first_contact.tar.gz" | cut -f1) KiB), $OUT/status.tsv"
else
    rm -f "$OUT/first_contact.tar.gz.tmp"
    echo "first contact: packing failed; the results stay in $RESULTS"
fi
cat "$OUT/status.tsv"
