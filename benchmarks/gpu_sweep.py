"""The embedded base-to-novel sweep with its trials on GPUs (benchmarks/gpu_check.sh).

    .venv/bin/python benchmarks/gpu_sweep.py [--logical-gpus N] [--cpus C] -- <base2novel flags>

Without --logical-gpus it is `sweeps/base2novel.py` itself: the sweep starts its local Ray,
which finds the machine's GPUs. With --logical-gpus N (gpu_check.sh's dry run) a local Ray is
started first with N logical GPUs (`ray.init(num_gpus=N)`, a resource count: nothing fakes
CUDA), so the same sweep schedules, packs and places its trials on GPU ids while
`--set train.device=cpu` keeps their tensors on the CPU.

While the sweep runs, a thread polls Ray's free GPUs; at the end one line (wrapped here) says what
the GPUs held:

    SUMMARY done in 95 s; peak 2.0 of 2 GPUs reserved at once; search trials on GPU ids 0,0,1,1
        (devices cpu)

(the ids come from each search trial's workers.json; the final phase's runs are left out).
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "sweeps"))


class GpuReservations:
    """Polls the cluster's free GPUs while a sweep runs: the most GPUs reserved at one time. The
    sweep may start Ray itself, so polling begins once Ray is up."""

    def __init__(self, interval_s: float = 0.2):
        self.interval_s, self.peak, self.total = interval_s, 0.0, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        import ray

        while not self._stop.wait(self.interval_s):
            if not ray.is_initialized():
                continue
            try:
                self.total = ray.cluster_resources().get("GPU", 0.0)
                free = ray.available_resources().get("GPU", 0.0)
            except Exception:  # Ray shutting down at the sweep's end: the peak is already known
                continue
            self.peak = max(self.peak, self.total - free)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def search_trial_placements(sweep_folder: Path) -> list[dict]:
    """Every worker of the search trials under a sweep folder (workers.json), final runs left
    out."""
    from vacsr.distributed.worker_gpus import WORKERS_FILE, read_workers
    from vacsr.sweep.plan.folders import FINAL

    return [worker for path in sorted(sweep_folder.rglob(WORKERS_FILE)) if FINAL not in path.parts
            for worker in read_workers(path.parent)]


def summary(seconds: float, use: GpuReservations, workers: list[dict]) -> str:
    ids = sorted(gpu for worker in workers for gpu in worker["gpu_ids"])
    devices = sorted({worker["device"] for worker in workers})
    return (f"SUMMARY done in {seconds:.0f} s; peak {use.peak:.1f} of {use.total:.0f} GPUs "
            f"reserved at once; search trials on GPU ids {','.join(ids) or 'none'} "
            f"(devices {','.join(devices) or 'none'})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logical-gpus", type=int, default=0,
                        help="start the local Ray with this many logical GPUs (dry run)")
    parser.add_argument("--cpus", type=int, default=None,
                        help="logical CPUs of that Ray (default: the machine's)")
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)  # ours before "--", the sweep's after
    args = parser.parse_args(argv[:split])
    sweep_args = argv[split + 1:]
    from base2novel import SWEEP

    from vacsr.sweep.cli import main as sweep_main
    from vacsr.sweep.plan.flags import build_parser
    from vacsr.sweep.plan.folders import sweep_folder

    if args.logical_gpus:
        from vacsr.distributed.cluster import ensure_ray

        os.environ.pop("RAY_ADDRESS", None)  # a local instance of our own, with these resources
        ensure_ray(num_cpus=args.cpus or os.cpu_count() or 1, num_gpus=args.logical_gpus,
                   log_to_driver=False)
    start = time.time()
    with GpuReservations() as use:
        code = sweep_main(SWEEP, sweep_args)
    if code == 0:
        named = build_parser(SWEEP).parse_args(sweep_args)
        workers = search_trial_placements(sweep_folder(named.storage, named.name))
        print(summary(time.time() - start, use, workers))
    return code


if __name__ == "__main__":
    sys.exit(main())
