"""base2novel sweep: `ray job submit --working-dir . -- python sweeps/base2novel.py [options]`.

With no options it runs the embedded default: a local Ray instance, synthetic data written in the
real on-disk layouts, the tiny open_clip model and a SQLite MLflow store.
"""
import sys

from vacsr.sweep.cli import main

if __name__ == "__main__":
    sys.exit(main("base2novel"))
