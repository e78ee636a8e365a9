#!/usr/bin/env bash
# The one prepared script for a lent GPU: everything it measures goes under $OUT, each part under
# its own timeout, so one failure cannot take the rest down. Fits in about 9 minutes on one GPU.
#
#   OUT=/tmp/out bash benchmarks/gpu_first_contact.sh            # on the GPU machine (the device tool sets $OUT)
#   OUT=/tmp/out DEVICE=cpu QUICK=1 bash benchmarks/gpu_first_contact.sh   # a smoke run of the script on CPU
#
# Every part logs to OUT/<part>.log; OUT/status.tsv: part, exit code (or skipped), seconds.
# Parts, in this order (the most wanted first; BUDGET, default 530 s, caps them all together):
#   env       GPU, driver, CUDA, cuDNN, NCCL versions, torch's view of the devices  -> OUT/env.json
#   bench     bench_gpu.py: RevNet18 CIFAR and RevNet50 ImageNet, every method, at the
#             training (fp32), fastest (tf32) and bf16 settings                       -> OUT/bench/*.json
#   precision PETRA's reconstruction error per stage under fp32, TF32 and bf16        -> OUT/precision/*.json
#   resume    a 2-epoch synthetic `petra train device=cuda` stopped by SIGTERM and resumed; its run files
#   train_bf16 the same run for one epoch at precision=bf16                           -> OUT/bf16/run
#   gpu_tests pytest -m gpu with a junit report                                     -> OUT/gpu_tests.xml
#   loader    bench_loader.py on synthetic data (what the data layer makes, pinned)
set -u
OUT=${OUT:?set OUT to the directory the results go to}
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-}
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
mkdir -p "$OUT"
printf 'part\texit\tseconds\n' > "$OUT/status.tsv"

BUDGET=${BUDGET:-530}  # seconds for the whole script: no part runs past it (the lease is short)

part() {  # part NAME TIMEOUT_S COMMAND...  (the timeout is cut to what is left of BUDGET)
    local name=$1 limit=$2; shift 2
    local start=$SECONDS left=$((BUDGET - SECONDS))
    if [ "$left" -lt 15 ]; then
        printf '%s\t%s\t%s\n' "$name" skipped 0 >> "$OUT/status.tsv"
        echo "first contact: $name skipped: the ${BUDGET} s budget is spent"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local code=$?
    printf '%s\t%s\t%s\n' "$name" "$code" "$((SECONDS - start))" >> "$OUT/status.tsv"
    echo "first contact: $name exited $code after $((SECONDS - start)) s"
}

part env 60 "$PY" - "$OUT/env.json" <<'PYEOF'
import json, platform, subprocess, sys
import torch
info = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
        "cuda_available": torch.cuda.is_available(), "platform": platform.platform(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
try:
    info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                         "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
except (OSError, subprocess.TimeoutExpired) as err:
    info["nvidia_smi"] = f"unavailable: {err}"
open(sys.argv[1], "w").write(json.dumps(info, indent=1) + "\n")
print(json.dumps(info, indent=1))
PYEOF

# the most wanted numbers first: a part cut short by the budget loses the least
if [ "$DEVICE" = cuda ]; then
    part bench 300 "$PY" benchmarks/bench_gpu.py --configs revnet18:cifar,revnet50:imagenet \
        --settings training,fastest,bf16 --out "$OUT/bench"
else
    part bench 120 "$PY" benchmarks/bench_gpu.py --device cpu --quick --settings training,bf16 --out "$OUT/bench"
fi

if [ -n "$QUICK" ]; then
    part precision 120 "$PY" benchmarks/bench_precision.py --device "$DEVICE" --archs revnet18 --width 8 --out "$OUT/precision"
else
    part precision 120 "$PY" benchmarks/bench_precision.py --device "$DEVICE" --out "$OUT/precision"
fi

# a short run on the device, stopped by SIGTERM after its first epoch's checkpoint, then resumed
RUN="$OUT/resume/run"
TRAIN=(train dataset=synthetic synthetic_train=512 synthetic_test=128 batch_size=32 epochs=2 width=8
       method=petra "device=$DEVICE" progress=false --run-dir "$RUN")
part resume_interrupted 90 "$PY" -m petra_core.cli "${TRAIN[@]}" --fault-at 0:20:SIGTERM
part resume_finished 90 "$PY" -m petra_core.cli "${TRAIN[@]}"
# the same run at bf16 (autocast; weights and messages float32): does PETRA still train?
part train_bf16 60 "$PY" -m petra_core.cli train dataset=synthetic synthetic_train=512 synthetic_test=128 \
    batch_size=32 epochs=1 width=8 method=petra precision=bf16 "device=$DEVICE" progress=false --run-dir "$OUT/bf16/run"

[ "$DEVICE" = cuda ] && part gpu_tests 120 "$PY" -m pytest -q -m gpu --junitxml="$OUT/gpu_tests.xml" tests/

LOADER_BATCHES=300
[ -n "$QUICK" ] && LOADER_BATCHES=30
part loader 60 "$PY" benchmarks/bench_loader.py --dataset synthetic --batches "$LOADER_BATCHES"
echo "first contact: done; $OUT/status.tsv"
cat "$OUT/status.tsv"
