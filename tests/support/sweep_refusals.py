"""A sweep's refusal as its user meets it: the entry point run in this process, the one line
`vacsr: error: ...` it ends with (exit status 2), Ray never started; and what it left written."""
from __future__ import annotations

from pathlib import Path

from conftest import one_line
from sweeps.base2novel import SWEEP as BASE2NOVEL


def sweep_refused(argv: list, storage: Path, capsys, kind=BASE2NOVEL) -> str:
    """Run the sweep's entry point; the one stderr line it ends with (exit 2, no Ray)."""
    import ray

    from vacsr.sweep import cli

    line = one_line([*argv, "--storage", storage], capsys,
                    entry=lambda args: cli.main(kind, args))
    assert not ray.is_initialized()
    return line


def written_besides(tmp_path: Path, *kept: Path) -> list[Path]:
    """What is under `tmp_path` besides the `kept` folders and their contents."""
    return [p for p in tmp_path.rglob("*") if not any(p == k or k in p.parents for k in kept)]
