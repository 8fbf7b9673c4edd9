"""Ray Core and Ray Train: cluster connection, distributed training, the evaluation actors.

Ray Tune lives with the sweep that uses it (vacsr/sweep/search/, vacsr/sweep/flow/); the library
core (`vacsr.model`, `vacsr.train`, `vacsr.eval`, `vacsr.data`) never imports ray. Names are
loaded lazily so that importing one submodule does not import the others.
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
