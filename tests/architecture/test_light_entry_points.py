"""Help, a bad flag and a sweep refused on a locked folder answer without importing torch, ray,
mlflow, optuna or open_clip (each costs seconds of start-up; benchmarks/bench_imports.py shows
the figures): each path runs in a fresh interpreter that reports, as it exits, which of them it
had loaded."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

HEAVY = ("torch", "ray", "mlflow", "optuna", "open_clip", "torchvision", "pandas")
SCRIPT = str(REPO / "sweeps" / "base2novel.py")

# run `target` (a module's main or a script) as its user would; report what it imported at exit
PROBE = """
import atexit, json, runpy, sys
heavy, target, argv = json.loads(sys.argv[1])
atexit.register(lambda: print("LOADED " + json.dumps([m for m in heavy if m in sys.modules]),
                              file=sys.stderr))
sys.argv = [target, *argv]
if target.endswith(".py"):
    runpy.run_path(target, run_name="__main__")
else:
    from vacsr.cli import main
    sys.exit(main(argv))
"""


def _probe(target: str, *argv: str, timeout: float = 120) -> tuple[int, str, list[str]]:
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps([HEAVY, target, argv])],
                         capture_output=True, text=True, timeout=timeout)
    lines = out.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("LOADED "), out.stderr[-2000:]
    return out.returncode, "\n".join(lines[:-1]), json.loads(lines[-1][len("LOADED "):])


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["eval", "--help"],
                                  ["demo", "--help"], ["best", "--help"],
                                  ["pretrain-tiny", "--help"], ["generate-data", "--help"]])
def test_vacsr_help_imports_none_of_the_heavy_dependencies(argv):
    code, _, loaded = _probe("vacsr", *argv)
    assert code == 0 and loaded == []


@pytest.mark.parametrize("argv, code", [(["--help"], 0), (["--trials", "0"], 2),
                                        (["--datasets", "nope"], 2)])
def test_the_sweep_script_answers_help_and_bad_flags_light(argv, code):
    returned, err, loaded = _probe(SCRIPT, *argv)
    assert returned == code and loaded == [], err
    if code:
        assert len(err.splitlines()) == 1 and err.startswith("vacsr: error:"), err


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)


def test_the_help_lists_every_command_and_shows_defaults():
    import vacsr
    from vacsr.cli import build_parser

    commands = next(a for a in build_parser()._actions
                    if isinstance(a, argparse._SubParsersAction)).choices
    shown = _run("-m", "vacsr.cli", "--help").stdout
    for name, parser in commands.items():
        assert f"    {name}" in shown, (name, shown)
    assert _run("-m", "vacsr.cli", "--version").stdout == f"vacsr {vacsr.__version__}\n"
    pretrain = " ".join(_run("-m", "vacsr.cli", "pretrain-tiny", "--help").stdout.split())
    assert "contrastive pretraining epochs (default: 6)" in pretrain, pretrain
    assert "(default: None)" not in pretrain


def test_the_sweep_help_states_what_a_bare_run_uses_and_errors_name_the_program_once():
    from sweeps.base2novel import SWEEP
    from vacsr.sweep.plan.embedded_profile import load_profile

    profile = load_profile(SWEEP)
    shown = " ".join(_run(SCRIPT, "--help").stdout.split())
    assert "Without --data-root it runs the embedded profile" in shown
    assert f"trials per dataset (default 24; without --data-root {profile['trials']})" in shown
    seeds = ",".join(map(str, profile["seeds"]))
    assert f"seeds of the final re-runs (default 1,2,3; without --data-root {seeds})" in shown
    bad = _run(SCRIPT, "--bogus")
    assert bad.returncode == 2 and bad.stderr == \
        "vacsr: error: unrecognized arguments: --bogus (see sweeps/base2novel.py --help)\n"


def test_a_sweep_on_a_locked_folder_is_refused_light(tmp_path):
    """The second driver of a folder checks its plan and stops at the lock, in one line, before
    anything heavy is imported or any data is written."""
    folder = tmp_path / "base2novel"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; "
         "from vacsr.sweep.plan.ownership import DriverLock; "
         "lock = DriverLock(Path(sys.argv[1])); print('locked', flush=True); time.sleep(120)",
         str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        code, err, loaded = _probe(SCRIPT, "--storage", str(tmp_path), "--trials", "1")
    finally:
        holder.kill()
        holder.wait(timeout=10)
    assert code == 2 and "another sweep driver is running in this folder" in err, err
    assert len(err.splitlines()) == 1, err
    assert loaded == []
    assert not (folder / "data").exists()


def test_the_task_names_the_config_checks_are_the_task_classes():
    """vacsr/task_names.py (read without the model stack), vacsr/tasks.py and the data layer's
    split builders name the same tasks, and each task's sweep settings are valid config keys."""
    from vacsr.config import Config, flatten
    from vacsr.data import SPLIT_BUILDERS
    from vacsr.task_names import SWEEP_RUN_SETTINGS, TASK_NAMES
    from vacsr.tasks import TASKS

    assert tuple(TASKS) == TASK_NAMES == tuple(SPLIT_BUILDERS)
    keys = set(flatten(Config()))
    assert all(set(settings) <= keys for settings in SWEEP_RUN_SETTINGS.values())


def test_the_sweep_driver_and_a_cached_tiny_clip_leave_out_the_model_stack(tmp_path):
    """The driver process never trains: its module (which each dataset task imports before
    its own search and final runs), writing the synthetic data in its real layouts, the memory
    estimate of its plan (the tiny model's and ViT-B/16's, from their config files) and the
    tiny CLIP's cache lookup import neither torch nor open_clip; the cache digest still names
    the exact torch build."""
    code = ("import json, sys; import vacsr.sweep.flow.driver; "
            "from vacsr.data.generate import generate_all; "
            f"generate_all({str(tmp_path / 'data')!r}, datasets=['coco', 'eurosat']); "
            "from vacsr.model.memory import estimate_step_memory; "
            "assert estimate_step_memory('vacsr-tiny')['total'] > 0; "
            "assert estimate_step_memory('ViT-B-16')['total'] > 0; "
            "from vacsr.model.pretrained_cache import TINY_RECIPE, recipe_digest; "
            "digest = recipe_digest(dict(TINY_RECIPE)); "
            "print(json.dumps([digest, [m for m in sys.argv[1:] if m in sys.modules]]))")
    out = _run("-c", code, "torch", "open_clip", "torchvision", "ray.train")
    assert out.returncode == 0, out.stderr[-2000:]
    digest, loaded = json.loads(out.stdout)
    assert loaded == []
    assert (tmp_path / "data" / "coco").is_dir() and (tmp_path / "data" / "eurosat").is_dir()
    import torch

    from vacsr.model import pretrained_cache

    with pytest.MonkeyPatch.context() as patch:  # another build of one torch version
        real = pretrained_cache.sha256_of
        patch.setattr(pretrained_cache, "sha256_of", lambda path: "other build"
                      if Path(path).parent == Path(torch.__file__).parent else real(path))
        assert pretrained_cache.recipe_digest(dict(pretrained_cache.TINY_RECIPE)) != digest
    assert pretrained_cache.recipe_digest(dict(pretrained_cache.TINY_RECIPE)) == digest
