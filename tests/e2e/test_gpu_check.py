"""`make gpu-check DRY_RUN=1`: every step of benchmarks/gpu_check.sh runs on the CPU at tiny sizes
(the gpu tests skip there, the training step, the scorer and the sweep on two logical GPUs run),
and the summary block lists each step's figure. A GPU run executes the same script without
DRY_RUN; only it measures the figures that matter (step time and peak memory of ViT-B/16, the
COCO-5K scoring target).

The dry run's sweep is also the test of GPU packing: its four trials of `--gpus-per-worker 0.5`
on 2 logical GPUs (a resource count: nothing fakes CUDA) must all run at once, two per GPU, while
train.device=cpu keeps their tensors on the CPU. The steps run in two tests (GPU_CHECK_STEPS):
the sweep with the Ray-marked tests, the single-process steps beside them."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = [pytest.mark.timeout(1900)]



def _dry_run(tmp_path, steps: tuple[str, ...]) -> dict[str, str]:
    """Run the dry run's `steps` (GPU_CHECK_STEPS); its summary row of each step."""
    # os.environ carries conftest.py's longer Ray Train worker start timeout
    env = {**os.environ, "PY": sys.executable, "DRY_RUN": "1", "GPU_CHECK_OUT": str(tmp_path),
           "PYTHONPATH": str(REPO), "GPU_CHECK_STEPS": " ".join(steps)}
    run = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh")], env=env,
                         capture_output=True, text=True, timeout=1850)
    out = run.stdout
    assert run.returncode == 0, (out[-3000:], run.stderr[-2000:])
    summary = out[out.index("==== gpu-check summary (dry run on the CPU"):].splitlines()[1:]
    rows = {line.split()[0]: line for line in summary
            if line.split() and line.split()[0] in ("gpu-tests", "train-step", "scorer", "sweep",
                                                    "trainable-side")}
    assert set(rows) == set(steps), summary  # the steps named, and only they
    for name, line in rows.items():
        assert re.search(rf"^{name}\s+ok \(\d+s\)\s+\S", line), line  # ok, then a figure
    return rows


def test_an_unknown_step_is_one_line_and_exit_2_before_any_step(tmp_path):
    env = {**os.environ, "PY": sys.executable, "DRY_RUN": "1", "GPU_CHECK_OUT": str(tmp_path),
           "GPU_CHECK_STEPS": "scorer sweeps"}
    run = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.strip().splitlines() == [
        "gpu-check: GPU_CHECK_STEPS: unknown step 'sweeps' (expected gpu-tests, train-step, "
        "scorer, sweep or trainable-side)"], run.stderr
    assert run.stdout == "" and not any(tmp_path.iterdir())  # nothing ran, nothing written


@pytest.mark.slow
def test_gpu_check_dry_run_executes_the_single_process_steps(tmp_path):
    rows = _dry_run(tmp_path, ("gpu-tests", "train-step", "scorer", "trainable-side"))
    assert "skipped" in rows["gpu-tests"]  # collected and run; they need CUDA
    assert "bf16 on cpu (dry run)" in rows["train-step"] and "finite" in rows["train-step"]
    assert "PASS" in rows["scorer"]
    assert "last/first step" in rows["trainable-side"] and "warm/cold val pass" in rows[
        "trainable-side"]


@pytest.mark.slow
@pytest.mark.ray
def test_gpu_check_dry_run_sweep_packs_half_gpu_trials_two_per_gpu(tmp_path):
    rows = _dry_run(tmp_path, ("sweep",))
    assert "done in" in rows["sweep"]
    # 4 trials x 1 worker x 0.5 GPU reserved together: all four ran at once, packed two per GPU
    assert "peak 2.0 of 2 GPUs reserved at once" in rows["sweep"], rows["sweep"]
    assert "search trials on GPU ids 0,0,1,1 (devices cpu)" in rows["sweep"], rows["sweep"]
    assert (tmp_path / "sweep" / "gpu-check" / "report" / "results.md").is_file()
