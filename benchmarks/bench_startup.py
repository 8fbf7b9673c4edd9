"""The fixed start-up of one Ray Train run, against the same training in one process.

    RAY_USAGE_STATS_ENABLED=0 .venv/bin/python benchmarks/bench_startup.py [--repeats 2]

Trains the embedded sweep's smallest run (vacsr-tiny, synthetic EuroSAT, 2 shots, 1 epoch, adapter
H 64, batch 5 as in the EuroSAT protocol, 0.5 CPU per worker, 1 worker) in a fresh process with
`Trainer(config).fit()`, as a Tune trial the way a sweep runs one (a Tuner of one `run_trial`
trial holding 0.1 CPU, MLflow on) and through `fit_ray`. The Ray runs go two ways, interleaved in
one Ray instance: "before" is the previous path, kept here (Ray's TorchTrainer and TorchConfig,
its Train controller and placement-group cleaner actors per run, TuneReportCallback, the worker
importing with the garbage collector on), "after" is the current code (in a trial, the controller
runs in the trial actor and the sweep's one shared cleaner, started here once as the sweep driver
does, keeps the placement groups; its column counts its polling). Every process of the Ray instance is sampled from /proc while a run lasts, so the CPU-seconds
of each process (trial actor, Train controller, worker, Ray Train's helper actors, Ray's daemons,
this driver) add up to the run's total. A run's start-up is its total CPU (and wall time) minus
the in-process `fit()`: what a Ray Train run costs on top of the training itself. A second Ray
instance runs one trial each way with Python's import timer on (PYTHONPROFILEIMPORTTIME), for the
big modules each process loaded. About 5 minutes on 2 CPUs; CPU-seconds vary by ~20% with the
machine's load, the before/after ratio less (the runs interleave).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TICK = os.sysconf("SC_CLK_TCK")
# modules a process that does not train should not load (ray.train.torch: Ray's TorchTrainer and
# TorchConfig); import times are cumulative and nest (torch is inside ray.train.torch)
BIG_MODULES = ("torch", "torchvision", "timm", "open_clip", "mlflow", "matplotlib", "pandas",
               "ray.train.torch", "ray.tune", "ray.data", "vacsr.train.loop")
# process titles (Ray names a worker process after its actor) -> role
ROLES = (("trial actor", ("ImplicitFunc",)), ("controller", ("TrainController",)),
         ("worker", ("RayTrainWorker",)), ("PG cleaner", ("PlacementGroupCleaner",)),
         ("sync actor", ("SynchronizationActor",)), ("DatasetManager", ("DatasetManager",)),
         ("Tune queue", ("_QueueActor",)))
CONFIG = ["data.task=classification", "data.dataset=eurosat", "data.shots=2", "train.epochs=1",
          "adapter.hidden_dim=64", "train.batch_size=5", "train.cpus_per_worker=0.5",
          "train.progress=false", "train.resume=false", "train.device=cpu"]
COLUMNS = ("trial actor", "controller", "worker", "PG cleaner", "sync actor", "DatasetManager",
           "Tune queue", "other actors", "Ray daemons", "driver")


# ------------------------------------------------------------------ process accounting
def _stat(pid: int) -> tuple[int, float, int] | None:
    """(ppid, user + system CPU-seconds, start tick) of a process; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK, int(fields[19])


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""


class ProcessSampler(threading.Thread):
    """Every process under this one (the local Ray instance: daemons and workers), polled every
    `interval` s: its CPU at the last sighting and the titles it had (an idle Ray worker takes
    the title of the actor it becomes). A process that exits between two polls loses at most
    `interval` CPU-seconds of its last moments, mostly idle ones."""

    def __init__(self, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.interval, self.root = interval, os.getpid()
        self.last: dict[tuple, float] = {}
        self.titles: dict[tuple, set] = defaultdict(set)
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.own_cpu = 0.0  # this thread's CPU, left out of the driver's

    def _descendants(self) -> dict[int, tuple]:
        stats = {int(n): s for n in os.listdir("/proc") if n.isdigit() and (s := _stat(int(n)))}
        children = defaultdict(list)
        for pid, (ppid, _, _) in stats.items():
            children[ppid].append(pid)
        found, todo = {}, list(children[self.root])
        while todo:
            pid = todo.pop()
            found[pid] = stats[pid]
            todo.extend(children[pid])
        return found

    def poll(self) -> None:
        with self.lock:
            for pid, (_, cpu, started) in self._descendants().items():
                key = (pid, started)
                self.last[key] = cpu
                if len(self.titles[key]) < 8:
                    self.titles[key].add(_title(pid))

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.poll()
            self.own_cpu = time.thread_time()
            time.sleep(self.interval)

    def window(self) -> dict[tuple, float]:
        """Every process's CPU now: processes already running count from here on."""
        self.poll()
        with self.lock:
            return dict(self.last)

    def cpu_by_process(self, since: dict) -> dict[tuple, tuple[float, set]]:
        with self.lock:
            return {key: (cpu - since.get(key, 0.0), set(self.titles[key]))
                    for key, cpu in self.last.items()}


def role_of(titles: set) -> str:
    text = " ".join(titles)
    for role, marks in ROLES:
        if any(mark in text for mark in marks):
            return role
    if "default_worker.py" in text and "ray::" in text.replace("ray::IDLE", ""):
        return "other actors"
    return "Ray daemons"  # gcs, raylet, dashboard, agents, log monitor, idle pool workers


def import_times(stderr_text: str) -> dict[str, float]:
    """{module: seconds} for BIG_MODULES from PYTHONPROFILEIMPORTTIME lines (a module is reported
    once, where it is first loaded; the time includes what it imports)."""
    found = {}
    for line in stderr_text.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \| +(\S+)$", line)
        if match and match.group(2) in BIG_MODULES and match.group(2) not in found:
            found[match.group(2)] = int(match.group(1)) / 1e6
    return found


def worker_log(session: Path, pid: int) -> str:
    files = (session / "logs").glob(f"worker-*-{pid}.err")
    return "\n".join(f.read_text(errors="replace") for f in files)


# ------------------------------------------------------------------ the training, three ways
def make_config(root: Path, out: Path):
    from vacsr.config import load_config

    return load_config(overrides=CONFIG + [f"data.root={root}", f"train.output_dir={out}"])


def in_process(root: Path, out: Path) -> dict:
    """Trainer(config).fit() in a fresh interpreter: import and fit times, imports loaded."""
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    proc = subprocess.run([sys.executable, __file__, "--child", str(root), str(out)], env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode:
        raise RuntimeError(f"in-process run failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["imports"] = import_times(proc.stderr)
    return result


def child(root: Path, out: Path) -> None:
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    import torch

    from vacsr.train.loop import Trainer

    torch.set_num_threads(1)  # as a Ray worker holding under one CPU
    ready_wall, ready_cpu = time.perf_counter(), time.process_time()
    result = Trainer(make_config(root, out)).fit()
    print(json.dumps({"import_wall": ready_wall - start_wall, "import_cpu": ready_cpu - start_cpu,
                      "fit_wall": time.perf_counter() - ready_wall,
                      "fit_cpu": time.process_time() - ready_cpu,
                      "train_loss": result.final_metrics["train/loss"]}))


def legacy_loop(loop_config: dict) -> None:
    """The worker entry point as it was: the model stack imported with the collector on."""
    from vacsr.config import from_dict
    from vacsr.distributed.worker import train_worker

    train_worker(from_dict(loop_config["config"]))


def legacy_trainer(config, name: str | None = None, callbacks: list | None = None):
    """The previous trainer: Ray's TorchTrainer with TorchConfig, on the same settings."""
    import ray.train.torch

    from vacsr.distributed.train import build_torch_trainer

    lean = build_torch_trainer(config, name=name, callbacks=callbacks)
    return ray.train.torch.TorchTrainer(
        legacy_loop, train_loop_config=lean.train_loop_config, scaling_config=lean.scaling_config,
        run_config=lean.run_config,
        torch_config=ray.train.torch.TorchConfig(backend=lean.backend_config.backend))


def legacy_run_trial(suggested: dict, base, meta) -> None:
    """run_trial as it was: TuneReportCallback (a queue actor) and the previous trainer."""
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    from vacsr.sweep.trial import with_suggestions

    config = with_suggestions(base, suggested)
    trial_id = tune.get_context().get_trial_id()
    config.train.output_dir = str(Path(meta.trial_root) / trial_id)
    config.train.storage_path = meta.ray_storage
    config.train.eval_test = False
    config.tracking.enabled = True
    config.tracking.uri, config.tracking.experiment = meta.tracking_uri, meta.experiment
    config.tracking.parent_run_id = meta.parent_run_id
    config.tracking.run_name = f"{meta.dataset}-{trial_id}"
    legacy_trainer(config, name=trial_id, callbacks=[TuneReportCallback()]).fit()


def tune_trial(config, folder: Path, legacy: bool):
    """One trial the way a sweep runs it: Tuner -> run_trial -> Ray Train, MLflow on. The
    driver's imports and the parent MLflow run come first, outside the measured `run()`: a sweep's
    dataset task pays them once, not per trial."""
    from ray import tune

    from vacsr.sweep.trial import TrialMeta, run_trial
    from vacsr.tracking import MlflowTracker

    folder.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    parent = MlflowTracker(uri).start("vacsr-bench", "eurosat")
    meta = TrialMeta(dataset="eurosat", trial_root=str(folder / "trials"),
                     ray_storage=str(folder / "ray"), tracking_uri=uri,
                     experiment="vacsr-bench", parent_run_id=parent)
    function = legacy_run_trial if legacy else run_trial
    trainable = tune.with_resources(tune.with_parameters(function, base=config, meta=meta),
                                    {"CPU": 0.1})
    tuner = tune.Tuner(trainable, tune_config=tune.TuneConfig(num_samples=1),
                       run_config=tune.RunConfig(name="bench", verbose=0,
                                                 storage_path=str(folder / "tune")))

    def run() -> dict:
        results = tuner.fit()
        if results.errors:
            raise RuntimeError(f"the trial failed: {results.errors[0]}")
        return {"train_loss": results[0].metrics["train/loss"]}

    return run


def plain_fit_ray(config, folder: Path, legacy: bool):
    """`vacsr train --ray`'s path (imports first, outside the measured `run()`: the driver
    reads the final checkpoint with torch, once per process)."""
    import ray.train.torch  # noqa: F401  (the previous trainer's module)

    from vacsr.distributed.train import fit_ray, result_from_checkpoint
    from vacsr.train.loop import TrainResult  # noqa: F401

    config.train.output_dir = str(folder)

    def run() -> dict:
        if not legacy:
            return {"train_loss": fit_ray(config).final_metrics["train/loss"]}
        result = result_from_checkpoint(legacy_trainer(config).fit().checkpoint, folder)
        return {"train_loss": result.final_metrics["train/loss"]}

    return run


# ------------------------------------------------------------------ measuring
def measure(run, sampler: ProcessSampler, session: Path | None) -> dict:
    """Wall time of `run()` and the CPU-seconds of every process it involved, by role."""
    since = sampler.window()
    own0, sampler0 = time.process_time(), sampler.own_cpu
    start = time.perf_counter()
    result = run()
    wall = time.perf_counter() - start
    time.sleep(1.0)  # the run's actors exit: their last CPU is sampled
    sampler.poll()
    roles, imports, busiest = defaultdict(float), {}, defaultdict(float)
    for key, (cpu, titles) in sampler.cpu_by_process(since).items():
        role = role_of(titles)
        roles[role] += cpu
        if session is not None and cpu > busiest[role]:
            busiest[role] = cpu
            imports[role] = import_times(worker_log(session, key[0]))
    roles["driver"] = time.process_time() - own0 - (sampler.own_cpu - sampler0)
    return {"wall": wall, "cpu": sum(roles.values()), "roles": dict(roles), "imports": imports,
            **result}


def start_ray(import_times_on: bool) -> Path:
    """A local Ray instance of 2 CPUs (as the embedded sweep on this machine); with
    `import_times_on`, every daemon and worker reports its imports to its log."""
    import ray

    from vacsr.distributed.cluster import ensure_ray, quiet_logging
    from vacsr.distributed.placement import start_cleaner

    if import_times_on:
        os.environ["PYTHONPROFILEIMPORTTIME"] = "1"  # inherited by every Ray process
    try:
        quiet_logging()
        ensure_ray(num_cpus=2, log_to_driver=False)
        start_cleaner()  # as the sweep driver does, once per sweep
    finally:
        os.environ.pop("PYTHONPROFILEIMPORTTIME", None)
    return Path(ray._private.worker._global_node.get_session_dir_path())


def ray_runs(root: Path, folder: Path, repeats: int) -> dict[str, dict]:
    """Tune trials and fit_ray runs, before and after interleaved, in one Ray instance. A
    throw-away first trial starts Ray's once-per-cluster actors (Ray Data's autoscaling
    coordinator), which no later run pays for."""
    import ray

    start_ray(import_times_on=False)
    sampler = ProcessSampler()
    sampler.start()
    runs = {}
    try:
        tune_trial(make_config(root, folder / "x"), folder / "warm-up", legacy=False)()
        for i in range(repeats):
            for legacy in (True, False):
                run = tune_trial(make_config(root, folder / "x"), folder / f"t{i}{legacy}", legacy)
                runs[f"Tune trial {i + 1} {_way(legacy)}"] = measure(run, sampler, None)
        for legacy in (True, False):
            run = plain_fit_ray(make_config(root, folder / "x"), folder / f"f{legacy}", legacy)
            runs[f"fit_ray {_way(legacy)}"] = measure(run, sampler, None)
    finally:
        sampler.stop_event.set()
        ray.shutdown()
    return runs


def import_runs(root: Path, folder: Path) -> dict[str, dict]:
    """One Tune trial each way with the import timer on, for the per-process imports."""
    import ray

    session = start_ray(import_times_on=True)
    sampler = ProcessSampler()
    sampler.start()
    try:
        return {f"Tune trial {_way(legacy)}": measure(
            tune_trial(make_config(root, folder / "x"), folder / f"i{legacy}", legacy),
            sampler, session) for legacy in (True, False)}
    finally:
        sampler.stop_event.set()
        ray.shutdown()


def _way(legacy: bool) -> str:
    return "before" if legacy else "after"


# ------------------------------------------------------------------ report
def _fmt_imports(found: dict[str, float]) -> str:
    return ", ".join(f"{m} {s:.1f}" for m, s in sorted(found.items(), key=lambda x: -x[1])) or "-"


def _mean(runs: list[dict], key) -> float:
    return sum(key(r) for r in runs) / len(runs)


def report(local: dict, runs: dict[str, dict], imports: dict[str, dict]) -> None:
    fit_cpu, fit_wall = local["fit_cpu"], local["fit_wall"]
    print(f"in-process Trainer(config).fit(): fit {fit_cpu:.1f} CPU-s ({fit_wall:.1f} s); its "
          f"imports {local['import_cpu']:.1f} CPU-s: {_fmt_imports(local['imports'])} (s)")
    print(f"\nCPU-seconds per process; start-up = run - in-process fit\n"
          f"{'run':<22}{'wall s':>7}{'CPU s':>7}{'start-up':>9}{'wall':>6}  "
          + " ".join(f"{c[:10]:>10}" for c in COLUMNS))
    for name, run in runs.items():
        print(f"{name:<22}{run['wall']:>7.1f}{run['cpu']:>7.1f}{run['cpu'] - fit_cpu:>9.1f}"
              f"{run['wall'] - fit_wall:>6.1f}  "
              + " ".join(f"{run['roles'].get(c, 0.0):>10.1f}" for c in COLUMNS))
    for kind in ("Tune trial", "fit_ray"):
        before = [r for n, r in runs.items() if n.startswith(kind) and n.endswith("before")]
        after = [r for n, r in runs.items() if n.startswith(kind) and n.endswith("after")]
        b, a = (_mean(x, lambda r: r["cpu"] - fit_cpu) for x in (before, after))
        bw, aw = (_mean(x, lambda r: r["wall"] - fit_wall) for x in (before, after))
        print(f"{kind} start-up, mean: before {b:.1f} CPU-s ({bw:.1f} s wall), after {a:.1f} "
              f"CPU-s ({aw:.1f} s wall): {100 * (1 - a / b):.0f}% less CPU")
    for name, run in imports.items():
        print(f"\n{name}, imports per process (wall s, import timer on):")
        for role in ("trial actor", "controller", "worker"):
            print(f"  {role:<12}{run['roles'].get(role, 0.0):>5.1f} CPU-s  "
                  f"{_fmt_imports(run['imports'].get(role, {}))}")
    losses = {name: run["train_loss"] for name, run in {**runs, **imports}.items()}
    same = all(loss == local["train_loss"] for loss in losses.values())
    print(f"\ntrain/loss in process {local['train_loss']!r}; every Ray run "
          + ("the same" if same else f"NOT the same: {losses}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("ROOT", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=2, help="Tune trials each way")
    parser.add_argument("--no-imports", action="store_true", help="skip the import-timer pass")
    args = parser.parse_args()
    if args.child:
        return child(Path(args.child[0]), Path(args.child[1]))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from vacsr.data.generate import generate_all

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        root = generate_all(folder / "data", datasets=["eurosat"], per_class=(4, 3, 2))
        local = in_process(root, folder / "local")
        runs = ray_runs(root, folder / "runs", args.repeats)
        imports = {} if args.no_imports else import_runs(root, folder / "imports")
    report(local, runs, imports)


if __name__ == "__main__":
    main()
