#!/usr/bin/env bash
# GPU check at the paper's real scale (arXiv 2605.30968): `make gpu-check`, or
#   PY=.venv/bin/python bash benchmarks/gpu_check.sh
#
# Runs, each under `timeout $STEP_TIMEOUT` (default 600 s), logging to $GPU_CHECK_OUT (default: a
# fresh temporary folder):
#   1. the GPU-marked tests (pytest -m gpu);
#   2. one bf16 training step of ViT-B/16 at batch 128 (random weights): time, and the peak of
#      torch.cuda.max_memory_allocated against vacsr.model.memory's estimate;
#   3. COCO-5K exact adapter scoring (5,000 x 25,000 pairs) against the GPU's bf16 matmul rate,
#      target under 5 s on one H200-class GPU (PASS/FAIL);
#   4. the embedded base2novel sweep on one dataset, its Ray Train workers on one GPU each.
# It ends with one summary block (each check: ok/fail and its key figure) and exits 1 when a check
# failed. Without CUDA it says so and exits 0: nothing here can be checked on a CPU.
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
STEP_TIMEOUT=${STEP_TIMEOUT:-600}
export RAY_USAGE_STATS_ENABLED=0

if ! command -v "$PY" >/dev/null 2>&1; then
    echo "gpu-check: $PY not found; run \`make install\` first (or set PY)" >&2
    exit 1
fi
probe=0
timeout 120 "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)' \
    || probe=$?
if [ "$probe" -eq 3 ]; then
    echo "gpu-check: needs CUDA (torch.cuda.is_available() is False on this machine); skipped"
    exit 0
elif [ "$probe" -ne 0 ]; then
    echo "gpu-check: could not import torch with $PY (exit $probe)" >&2
    exit 1
fi

OUT=${GPU_CHECK_OUT:-$(mktemp -d -t vacsr-gpu-check.XXXXXX)}
mkdir -p "$OUT"
SUMMARY=()
FAILED=0

last_line() { grep -v '^[[:space:]]*$' "$1" | tail -n 1 || true; }
summary_line() { grep '^SUMMARY' "$1" | tail -n 1 | cut -d' ' -f2- || last_line "$1"; }
pytest_line() { grep -E '[0-9]+ (passed|failed|skipped|error)|no tests ran' "$1" | tail -n 1 \
                | tr -d '=' | sed 's/^ *//' || true; }
sweep_line() { grep -E 'done in|failed' "$1" | tail -n 1 || last_line "$1"; }

# run_check NAME EXTRACTOR COMMAND...: run COMMAND under the timeout, tee its log, record a line.
run_check() {
    local name=$1 extract=$2 rc=0 status figure
    shift 2
    echo
    echo "== $name: $*"
    timeout --kill-after=30 "$STEP_TIMEOUT" "$@" 2>&1 | tee "$OUT/$name.log" || rc=$?
    figure=$("$extract" "$OUT/$name.log")
    if [ "$rc" -eq 0 ]; then
        status=ok
    elif [ "$rc" -eq 124 ]; then
        status="fail (timeout ${STEP_TIMEOUT}s)"
    else
        status="fail (exit $rc)"
    fi
    [ "$rc" -eq 0 ] || FAILED=$((FAILED + 1))
    SUMMARY+=("$(printf '%-12s %-22s %s' "$name" "$status" "$figure")")
}

echo "== environment (logs in $OUT)"
if command -v nvidia-smi >/dev/null 2>&1; then
    timeout 60 nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version \
        --format=csv || echo "nvidia-smi failed"
else
    echo "nvidia-smi: not on PATH"
fi
timeout 120 "$PY" -c 'import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
      f"{torch.cuda.device_count()} device(s), device 0: {torch.cuda.get_device_name(0)}, "
      f"bf16 supported: {torch.cuda.is_bf16_supported()}")' || echo "torch/CUDA query failed"

run_check gpu-tests pytest_line "$PY" -m pytest -q -m gpu -p no:cacheprovider tests
run_check train-step summary_line "$PY" benchmarks/gpu_train_step.py --model ViT-B-16 \
    --batch-size 128
run_check scorer summary_line "$PY" benchmarks/gpu_scorer.py --repeats 2 --target-s 5
run_check sweep sweep_line "$PY" sweeps/base2novel.py --datasets caltech101 --trials 2 \
    --gpus-per-worker 1 --storage "$OUT/sweep" --name gpu-check

echo
echo "==== gpu-check summary ($(timeout 60 nvidia-smi --query-gpu=name --format=csv,noheader \
    2>/dev/null | head -n 1 || echo "GPU")) ===="
printf '%s\n' "${SUMMARY[@]}"
echo "logs: $OUT"
[ "$FAILED" -eq 0 ] || { echo "$FAILED check(s) failed"; exit 1; }
