"""Shared fixtures: seeded torch, a pretrained tiny CLIP (built once per test run, no download).

`make test` runs the suite on pytest-xdist workers (`-n 2 --dist loadgroup`). The Ray-marked tests
go in two lanes (RAY_LANES), xdist groups that run one test after another, so that each worker
runs one lane beside its share of the other tests. Two Ray instances can run at once: a local
`ray.init` takes free ports (the dashboard tries the next port when 8265 is taken) and a test's
cluster started with `ray start` names free ports for all that have fixed defaults and stops
only its own nodes (tests/e2e/test_sweep_e2e.py). Two lanes and no more: a Ray test keeps both
cores busy for long stretches, so a third at once would only slow the others.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.support.budget import write_budget
from tests.support.disks import SmallDisk
from tests.support.servers import Servers, stop_session

# one process at a time between those of a test run: the lock the pretrained cache takes
from vacsr.model.pretrained_cache import _exclusive as _locked

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray Train gives a worker group 60 s to start; on a loaded 2-core machine a run's processes can
# take longer, which fails the run instead of the assertion under test (Ray's processes, the
# sweeps' subprocesses included, inherit this)
os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "600")
# One intra-op thread per test process: the tensors here are tiny, and a second OpenMP thread
# only spins (on 2 cores it doubled the CPU-seconds of a test and made it slower, while the
# other xdist worker's Ray processes wait for a core). Subprocesses (sweep drivers, `ray start`)
# inherit the variable; Ray's workers read it too.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

# The repository: the tests sit in folders by concern below tests/, and reach vacsr/, sweeps/,
# cluster/ and benchmarks/ from here
REPO = Path(__file__).resolve().parent.parent

# The two lanes of Ray tests, by module basename, balanced by their measured time (`--durations`,
# docs/performance.md): the sweep kinds' comparisons, the dead tracking server, the full disk
# and `ray job submit` in one, the rest in the other. A Ray test in a module not listed joins
# "ray-a".
RAY_LANES = {
    "ray-a": ("test_sweep_kinds.py", "test_sweep_tracking_down.py", "test_sweep_disk_full.py",
              "test_sweep_e2e.py"),
    "ray-b": ("test_sweep_signals.py", "test_ray_train.py", "test_gpu_check.py",
              "test_eval_actor.py", "test_plan_signals.py", "test_sweep_failures.py",
              "test_sweep_methods.py", "test_sweep_rehearsal.py", "test_sweep_repair.py"),
}
LANE_OF_MODULE = {module: lane for lane, modules in RAY_LANES.items() for module in modules}
# The tests that need the pretrained tiny CLIP run on one worker: it pretrains it (about 40 s of
# one core) while the other worker goes on with other tests instead of waiting for the file.
TINY_CLIP_GROUP = "tiny-clip"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    # a module renamed or gone would leave its lane short and "ray-a" long, silently
    stale = [module for module in LANE_OF_MODULE if not any(REPO.glob(f"tests/*/{module}"))]
    if stale:
        raise pytest.UsageError(f"RAY_LANES names {stale[0]}, no test module under tests/")
    # a test on a module's Ray instance unmarked would run outside the lanes (a third Ray
    # instance at once, on a worker of its own) and be left out of `make test-ray-oldest`
    unmarked = [i.nodeid for i in items
                if "ray_local" in i.fixturenames and not i.get_closest_marker("ray")]
    if unmarked:
        raise pytest.UsageError(f"{unmarked[0]} uses ray_local without the ray marker")
    for item in items:
        if item.get_closest_marker("ray"):
            lane = LANE_OF_MODULE.get(item.path.name, "ray-a")
            item.add_marker(pytest.mark.xdist_group(lane))
        elif "tiny_weights" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group(TINY_CLIP_GROUP))


def pytest_collection_finish(session):
    """On an xdist worker under --dist loadgroup, the lane must have reached the node ids
    (`<id>@ray-a`), or two Ray tests of one lane could run at once."""
    grouped = session.config.getoption("dist", "no") == "loadgroup"
    if not (os.environ.get("PYTEST_XDIST_WORKER") and grouped):
        return
    loose = [i.nodeid for i in session.items if i.get_closest_marker("ray")
             and i.nodeid.rsplit("@", 1)[-1] not in RAY_LANES]
    if loose:
        raise pytest.UsageError(f"pytest-xdist did not group the Ray tests ({loose[0]}); "
                                "install the pytest that pyproject.toml allows")


def pytest_terminal_summary(terminalreporter):
    write_budget(terminalreporter, RAY_LANES)


def _run_root(tmp_path_factory) -> Path:
    """A folder of this test run that every xdist worker shares (each has a basetemp of its
    own under it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def _run_cache(tmp_path_factory):
    """vacsr's caches (the pretrained tiny CLIP, listings, few-shot splits, Ray instance
    records, measured step costs) for this test run, shared by its workers and every process
    they start: the tiny CLIP is pretrained once per run, a sweep's step is calibrated once per
    run (a test that checks the calibration sets a cache of its own), and no test reads or fills
    the user's cache."""
    os.environ["VACSR_CACHE_DIR"] = str(_run_root(tmp_path_factory) / "cache")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _mlflow_uri_stays_put():
    """mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI: keep it from reaching later tests
    (and their subprocesses, whose sweeps would record into another test's store)."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory):
    """The tiny CLIP pretrained contrastively on synthetic data, as a local weights file: copied
    from the test run's pretrained cache (vacsr/model/pretrained_cache.py), which the first
    process to need it fills (seeded) while the others wait on its lock."""
    from vacsr.model.pretrained_cache import install_pretrained

    root = _run_root(tmp_path_factory)
    with _locked(root / "tiny-clip.lock"):
        return install_pretrained(root / "tiny-clip.pt")


@pytest.fixture
def read_only():
    """Make a folder read-only for real: a read-only bind mount for root (who ignores file
    modes), else chmod. Skips where neither holds."""
    import subprocess

    mounted, chmodded = [], []

    def apply(folder: Path) -> Path:
        if os.geteuid() == 0:
            done = subprocess.run(["mount", "--bind", str(folder), str(folder)],
                                  capture_output=True).returncode == 0
            if done:
                mounted.append(folder)
                done = subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)],
                                      capture_output=True).returncode == 0
        else:
            folder.chmod(0o555)
            chmodded.append(folder)
            done = True
        probe = folder / ".write-probe"
        try:
            probe.write_text("")
            probe.unlink()
            writable = True
        except OSError:
            writable = False
        if not done or writable:
            pytest.skip("cannot make a folder read-only here (needs root with mount, or a user)")
        return folder

    yield apply
    for folder in reversed(mounted):
        subprocess.run(["umount", str(folder)], capture_output=True)
    for folder in chmodded:
        folder.chmod(0o755)


@pytest.fixture
def small_disk():
    """A SmallDisk; its mounts go at the end of the test."""
    import subprocess

    disk = SmallDisk()
    yield disk
    for folder in reversed(disk.mounted):
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@pytest.fixture(scope="session")
def weights(tmp_path_factory) -> Path:
    """Randomly initialised tiny CLIP as a local file: no download, no 'no weights' warning."""
    from vacsr.model.backbone import create_clip

    path = tmp_path_factory.mktemp("weights") / "random-tiny.pt"
    # seeded here: a session fixture is set up before the per-test seed (_seed), so the draw
    # would otherwise depend on which tests an xdist worker ran before it
    torch.manual_seed(0)
    torch.save(create_clip("vacsr-tiny")[0].state_dict(), path)
    return path


def make_dataset_folders(root: Path) -> Path:
    """Every dataset's layout under `root`, two synthetic training images per class and one per
    other split: what a sweep checks before Ray starts (every image it will read, and a batch of
    each searched size in the few-shot training split), for the tests that only plan a sweep.
    Links to one copy per test run, written by the first test that needs it."""
    from vacsr.data.generate import generate_all

    shared = Path(os.environ["VACSR_CACHE_DIR"]).parent / "layouts"
    shared.parent.mkdir(parents=True, exist_ok=True)
    with _locked(shared.parent / "layouts.lock"):
        if not (shared / ".generated").is_file():
            generate_all(shared, per_class=(2, 1, 1))
            (shared / ".generated").write_text("ok\n")
    root.mkdir(parents=True, exist_ok=True)
    for layout in shared.iterdir():
        if not layout.name.startswith(".") and not (root / layout.name).exists():
            (root / layout.name).symlink_to(layout, target_is_directory=True)
    return root


def tracked_train(tmp_path: Path, weights: Path, capsys, *overrides: str) -> str:
    """A one-epoch `vacsr train` of the tiny CLIP on the CPU, tracked in a new SQLite store
    `tmp_path/mlflow.db`, its run in `tmp_path/run`; its stderr (it must exit 0)."""
    from vacsr.cli import main

    code = main(["train", f"model.pretrained={weights}", "train.epochs=1", "adapter.hidden_dim=16",
                 "train.progress=false", "train.device=cpu", "tracking.enabled=true",
                 f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
                 f"train.output_dir={tmp_path / 'run'}", *overrides])
    err = capsys.readouterr().err
    assert code == 0, err
    return err


def error_line(code, err: str) -> str:
    """The line `vacsr: error: ...` a refused command ends with, checked: exit status `code` 2
    and `err`, its whole stderr, that one line alone (no traceback, no warning beside it)."""
    lines = err.splitlines()
    assert code == 2, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith("vacsr: error: "), lines[-5:]
    assert err == lines[0] + "\n", err
    return lines[0]


def one_line(argv, capsys, entry=None) -> str:
    """error_line of `entry(argv)` in this process (`entry`: the `vacsr` command's main unless
    given; an argparse refusal exits, and its exit status counts as the return)."""
    if entry is None:
        from vacsr.cli import main as entry
    try:
        code = entry([str(a) for a in argv])
    except SystemExit as stop:
        code = stop.code
    return error_line(code, capsys.readouterr().err)


def refused(out) -> str:
    """error_line of a finished subprocess (a subprocess.CompletedProcess run with text=True)."""
    return error_line(out.returncode, out.stderr)


def assert_same_results(straight, resumed) -> None:
    """A resumed run's results (TrainResult) are the uninterrupted run's: every final metric and
    every weight of its checkpoint."""
    from vacsr.train.checkpoint import load_checkpoint

    for key, value in straight.final_metrics.items():
        if not key.endswith("eval_seconds"):  # wall-clock time, not a result
            # nan = nan: a Fig. 3 correlation over too few filled bins is nan in both runs
            assert resumed.final_metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6,
                                                               nan_ok=True), key
    a = load_checkpoint(straight.checkpoint)["model"]
    b = load_checkpoint(resumed.checkpoint)["model"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], msg=name)


def nothing_written(folder: Path) -> None:
    assert not folder.exists() or not any(folder.rglob("*")), list(folder.rglob("*"))


@pytest.fixture
def servers(tmp_path):
    """A Servers for the test; every server it started is stopped at the end of the test."""
    import shutil

    started = Servers(tmp_path)
    yield started
    for process in reversed(started.started):
        stop_session(process)
    for folder in started.folders:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_local(request):
    """A local Ray instance of the test module's own, shut down after the module; yields the
    `ray` module. 2 CPUs, and what the module's RAY_LOCAL dict adds (ensure_ray's num_gpus,
    include_dashboard, log_to_driver); never a cluster that RAY_ADDRESS names, nor an instance
    an earlier test left running (that one is shut down first)."""
    import ray

    from vacsr.distributed.cluster import ensure_ray

    # no dashboard head (ensure_ray's default): nothing a test checks through this instance
    # needs it (the `ray job submit` test starts a cluster of its own)
    settings = {"num_cpus": 2, **getattr(request.module, "RAY_LOCAL", {})}
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    if ray.is_initialized():
        ray.shutdown()
    try:
        with pytest.MonkeyPatch.context() as env:
            env.delenv("RAY_ADDRESS", raising=False)
            ensure_ray(**settings)
        assert ray.cluster_resources().get("CPU") == settings["num_cpus"]
        if settings.get("num_gpus"):
            assert ray.cluster_resources().get("GPU") == settings["num_gpus"]
        yield ray
    finally:
        ray.shutdown()


def small_adapter(seed: int | None = None, *, embed_dim: int = 16, hidden_dim: int = 32,
                  latent_dim: int = 4, num_components: int = 2, decoder_hidden_dim: int = 8,
                  **settings):
    """A small VariationalSimilarityAdapter (`settings`: its other arguments). With `seed`: a
    random init drawn from that seed with every weight times 3 (well-spread logits, so rankings
    are tolerance-safe), in eval mode, for the scoring tests."""
    from vacsr.model.adapter import VariationalSimilarityAdapter

    shape = dict(embed_dim=embed_dim, hidden_dim=hidden_dim, latent_dim=latent_dim,
                 num_components=num_components, decoder_hidden_dim=decoder_hidden_dim)
    if seed is None:
        return VariationalSimilarityAdapter(**shape, **settings)
    torch.manual_seed(seed)
    head = VariationalSimilarityAdapter(**shape, **settings, init="random").eval()
    with torch.no_grad():
        for p in head.parameters():
            p.mul_(3.0)
    return head


def built_plan(kind, folder: Path, **fields):
    """A SweepPlan built directly, as the driver holds it, without the command line's checks and
    imports (seconds): named "t", no datasets, its sweep folder `folder`/sweep, its records in
    the SQLite store `folder`/mlflow.db; `fields` set any of SweepPlan's fields."""
    from vacsr.sweep.plan.plan import SweepPlan

    plan = dict(name="t", configs={}, spaces={}, storage=folder / "sweep",
                tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    return SweepPlan(kind=kind, **{**plan, **fields})


def sweep_plan(kind, storage: Path, argv=(), *, data: Path | None = None, monkeypatch=None):
    """A sweep's plan as its command line makes it from `argv` and --storage `storage`. `data`:
    every dataset's layout linked there (make_dataset_folders), passed as --data-root.
    Without it, the embedded profile: with `monkeypatch`, without writing its data or
    pretraining the tiny CLIP."""
    from vacsr.sweep.cost.memory import refuse_unfit
    from vacsr.sweep.plan import command_line as cli
    from vacsr.sweep.plan.flags import build_parser

    if data is None and monkeypatch is not None:
        monkeypatch.setattr(cli, "write_embedded_data", lambda *a: None)
    root = [] if data is None else ["--data-root", str(make_dataset_folders(data))]
    args = build_parser(kind).parse_args([*root, "--storage", str(storage), *argv])
    return cli.plan_from_args(kind, args, check_memory=refuse_unfit)
