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
#   4. the embedded base2novel sweep on one dataset, its trials side by side (--concurrent-trials),
#      each on a GPU of its own, with the most GPUs reserved at once and the GPU ids each search
#      trial ran on (benchmarks/gpu_sweep.py);
#   5. ViT-B/16 training steps with the first and with the last 2 blocks of each tower training,
#      and a val pass over 256 images with the frozen prefix's cache cold and warm
#      (benchmarks/bench_trainable_side.py).
# It ends with one summary block (each check: ok/fail and its key figure) and exits 1 when a check
# failed. Without CUDA it says so and exits 0, unless DRY_RUN=1.
#
# DRY_RUN=1 (`make gpu-check DRY_RUN=1`; tests/e2e/test_gpu_check.py runs it) executes every step
# on the CPU at tiny sizes through the same code: the gpu tests (they skip without CUDA), the bf16
# training step on vacsr-tiny (train.amp_on_cpu), the bf16 scorer on 50 x 250 pairs, and the
# sweep on two logical GPUs of a local Ray (benchmarks/gpu_sweep.py): four trials of half a GPU
# each, which Ray must run all at once, packed two per GPU (train.device=cpu keeps the tensors on
# the CPU while Ray schedules and places the trials on the GPU ids).
#
# GPU_CHECK_STEPS="scorer sweep" runs only the steps named (default: all five, in this order).
#
# The whole real run fits one 10-minute call: each step's timeout is the smaller of STEP_TIMEOUT
# and what is left of TOTAL_TIMEOUT (default 540 s); see README "Real scale" for the estimate.
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
STEP_TIMEOUT=${STEP_TIMEOUT:-600}
DRY_RUN=${DRY_RUN:-0}
# a dry run on a busy CPU is slower than the GPU run it stands for
TOTAL_TIMEOUT=${TOTAL_TIMEOUT:-$([ "$DRY_RUN" = 1 ] && echo 1500 || echo 540)}
START=$SECONDS
STEPS=${GPU_CHECK_STEPS:-gpu-tests train-step scorer sweep trainable-side}
export RAY_USAGE_STATS_ENABLED=0
for step in $STEPS; do
    case $step in
        gpu-tests|train-step|scorer|sweep|trainable-side) ;;
        *) echo "gpu-check: GPU_CHECK_STEPS: unknown step '$step'" \
                "(expected gpu-tests, train-step, scorer, sweep or trainable-side)" >&2
           exit 2 ;;
    esac
done

if ! command -v "$PY" >/dev/null 2>&1; then
    echo "gpu-check: $PY not found; run \`make install\` first (or set PY)" >&2
    exit 1
fi
probe=0
timeout 120 "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)' \
    || probe=$?
if [ "$DRY_RUN" = 1 ]; then
    echo "gpu-check: DRY_RUN=1: every step on the CPU at tiny sizes (figures are not GPU figures)"
elif [ "$probe" -eq 3 ]; then
    echo "gpu-check: needs CUDA (torch.cuda.is_available() is False on this machine); skipped"
    echo "gpu-check: DRY_RUN=1 runs every step on the CPU at tiny sizes"
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

selected() { [[ " $STEPS " == *" $1 "* ]]; }

# run_check NAME EXTRACTOR COMMAND...: run COMMAND under the timeout, tee its log, record a line
# (a step GPU_CHECK_STEPS leaves out is not run and not listed).
run_check() {
    local name=$1 extract=$2 rc=0 status figure limit left begin
    shift 2
    selected "$name" || return 0
    left=$((TOTAL_TIMEOUT - (SECONDS - START)))
    limit=$(( left < STEP_TIMEOUT ? left : STEP_TIMEOUT ))
    [ "$limit" -ge 10 ] || limit=10
    echo
    echo "== $name (timeout ${limit}s): $*"
    begin=$SECONDS
    timeout --kill-after=30 "$limit" "$@" 2>&1 | tee "$OUT/$name.log" || rc=$?
    figure=$("$extract" "$OUT/$name.log")
    if [ "$rc" -eq 0 ]; then
        status="ok ($((SECONDS - begin))s)"
    elif [ "$rc" -eq 124 ]; then
        status="fail (timeout ${limit}s)"
    else
        status="fail (exit $rc)"
    fi
    [ "$rc" -eq 0 ] || FAILED=$((FAILED + 1))
    SUMMARY+=("$(printf '%-12s %-22s %s' "$name" "$status" "$figure")")
}

echo "== environment (logs in $OUT)"
if [ "$DRY_RUN" = 1 ]; then
    timeout 120 "$PY" -c 'import os, torch
print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}, "
      f"{os.cpu_count()} CPU(s): dry run on the CPU")'
elif command -v nvidia-smi >/dev/null 2>&1; then
    timeout 60 nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version \
        --format=csv || echo "nvidia-smi failed"
else
    echo "nvidia-smi: not on PATH"
fi
if [ "$DRY_RUN" != 1 ]; then
    timeout 120 "$PY" -c 'import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
      f"{torch.cuda.device_count()} device(s), device 0: {torch.cuda.get_device_name(0)}, "
      f"bf16 supported: {torch.cuda.is_bf16_supported()}")' || echo "torch/CUDA query failed"
fi

SWEEP=(--datasets caltech101 --storage "$OUT/sweep" --name gpu-check)
# the test files that hold GPU-marked tests: collecting only them keeps the step short
mapfile -t GPU_TESTS < <(grep -rl --include="test_*.py" "pytest.mark.gpu" tests | sort)
if [ "$DRY_RUN" = 1 ]; then
    # a busy CPU can take longer than Ray Train's 60 s default to start a worker process
    export RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S=${RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S:-600}
    if selected sweep; then  # random tiny weights: the dry run checks the path, not accuracy
        "$PY" -c 'import sys, open_clip, torch
from vacsr.model.backbone import register_model_configs
register_model_configs()
torch.save(open_clip.create_model("vacsr-tiny").state_dict(), sys.argv[1])' "$OUT/tiny-random.pt"
    fi
    run_check gpu-tests pytest_line "$PY" -m pytest -q -m gpu -p no:cacheprovider "${GPU_TESTS[@]}"
    run_check train-step summary_line "$PY" benchmarks/gpu_train_step.py --device cpu \
        --model vacsr-tiny --batch-size 8 --warmup 1 --steps 2
    run_check scorer summary_line "$PY" benchmarks/gpu_scorer.py --device cpu --images 50 \
        --repeats 1 --target-s 120 --matmul-size 512 --large-budget-mib 64
    run_check sweep summary_line "$PY" benchmarks/gpu_sweep.py --logical-gpus 2 --cpus 4 -- \
        "${SWEEP[@]}" --gpus-per-worker 0.5 --trials 4 --concurrent-trials 4 --seeds 1 --epochs 1 \
        --pretrained "$OUT/tiny-random.pt" --cpus-per-worker 0.5 \
        --trial-cpus 0.5 --set train.device=cpu --set train.amp_on_cpu=true
    run_check trainable-side summary_line "$PY" benchmarks/bench_trainable_side.py \
        --model vacsr-tiny --batch-size 8 --blocks 1 --images 32
    TITLE="dry run on the CPU"
else
    run_check gpu-tests pytest_line "$PY" -m pytest -q -m gpu -p no:cacheprovider "${GPU_TESTS[@]}"
    run_check train-step summary_line "$PY" benchmarks/gpu_train_step.py --model ViT-B-16 \
        --batch-size 128
    run_check scorer summary_line "$PY" benchmarks/gpu_scorer.py --repeats 2 --target-s 5
    run_check sweep summary_line "$PY" benchmarks/gpu_sweep.py -- "${SWEEP[@]}" \
        --gpus-per-worker 1 --trials 2 --concurrent-trials 2
    run_check trainable-side summary_line "$PY" benchmarks/bench_trainable_side.py --device cuda \
        --batch-size 128 --images 2048
    TITLE=$(timeout 60 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null \
            | head -n 1 || echo "GPU")
fi

echo
echo "==== gpu-check summary ($TITLE, $((SECONDS - START)) s) ===="
printf '%s\n' "${SUMMARY[@]}"
echo "logs: $OUT"
[ "$FAILED" -eq 0 ] || { echo "$FAILED check(s) failed"; exit 1; }
