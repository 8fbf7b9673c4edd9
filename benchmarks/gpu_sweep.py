"""The embedded base-to-novel sweep with its Ray Train workers on GPUs (benchmarks/gpu_check.sh).

    .venv/bin/python benchmarks/gpu_sweep.py [--logical-gpus N] [--cpus C] -- <base2novel flags>

Without --logical-gpus it is `sweeps/base2novel.py` itself: the sweep starts its local Ray,
which finds the machine's GPUs. With --logical-gpus N (gpu_check.sh's dry run) a local Ray is
started first with N logical GPUs (`ray.init(num_gpus=N)`, a resource count: nothing fakes
CUDA), so the same sweep schedules, packs and places its trials and workers on GPU ids while
`--set train.device=cpu` keeps their tensors on the CPU.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "sweeps"))


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

    if args.logical_gpus:
        from vacsr.distributed.cluster import ensure_ray

        os.environ.pop("RAY_ADDRESS", None)  # a local instance of our own, with these resources
        ensure_ray(num_cpus=args.cpus or os.cpu_count() or 1, num_gpus=args.logical_gpus,
                   log_to_driver=False)
    return sweep_main(SWEEP, sweep_args)


if __name__ == "__main__":
    sys.exit(main())
