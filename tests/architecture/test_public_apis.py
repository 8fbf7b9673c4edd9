"""vacsr uses the documented APIs of Ray, Optuna and open_clip only: no private module, class,
method or attribute of theirs (a private name can change in any release without notice)."""
from __future__ import annotations

import re

from conftest import REPO

PACKAGE = REPO / "vacsr"
# Ray's internal packages and the private names the run layer used before
PRIVATE = re.compile(r"_internal|\._ot_|_completed_trials|\._embeds|\._trial_id"
                     r"|_create_default_callbacks|_initialize_and_run_controller|TrainController")
# a private attribute of a third-party object in code: `ray._private.x`, `study._storage`,
# `visual._pool` (string literals, such as logger names, are not code)
THIRD_PARTY_PRIVATE = re.compile(r"\b(?:ray|tune|train|optuna|open_clip|study|visual|clip|"
                                 r"storage|trainer|searcher)\._[a-z]\w*")


STRING = re.compile(r"\"[^\"]*\"|'[^']*'")


def _hits(pattern: re.Pattern, code_only: bool = False) -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(STRING.sub('""', line) if code_only else line):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    return found


def test_no_private_ray_optuna_or_open_clip_names():
    assert _hits(PRIVATE) == []
    assert _hits(THIRD_PARTY_PRIVATE, code_only=True) == []
