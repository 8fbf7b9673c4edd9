"""Ray-side code: cluster connection, distributed training, the evaluation actors.

Everything Ray lives under this package (the library core, `vacsr.eval` and `vacsr.model`, never
imports ray). Names are loaded lazily so that importing one submodule does not import the others.
"""
from __future__ import annotations

import importlib

_LAZY = {"EvalActor": "vacsr.distributed.eval_actor", "EvalPool": "vacsr.distributed.eval_actor",
         "EvalWorker": "vacsr.distributed.eval_actor"}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vacsr.distributed' has no attribute {name!r}")
