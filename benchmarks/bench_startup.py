"""The fixed start-up of one Ray Train run, against the same training in one process.

    RAY_USAGE_STATS_ENABLED=0 .venv/bin/python benchmarks/bench_startup.py [--repeats 2] \
        [--before OLD_CHECKOUT]

Trains the embedded sweep's smallest run (vacsr-tiny, synthetic EuroSAT, 2 shots, 1 epoch, adapter
H 64, batch 5 as in the EuroSAT protocol, 0.5 CPU per worker, 1 worker) in a fresh process with
`Trainer(config).fit()`, as a Tune trial the way a sweep runs one (a Tuner of one `run_trial`
trial, MLflow on: the run trains in the trial's actor, which holds the worker's 0.5 CPU; trees
before that drove Ray Train from a 0.1-CPU actor), through `fit_ray`, and as a sweep's final seed
of one worker now runs (in an evaluation actor of its own, `PoolScorer.train`; older trees ran
it through `fit_ray`). Each vacsr tree (this
one, and with `--before` an older checkout, e.g. `git archive <commit> | tar -x -C /tmp/old`)
runs its Ray runs in a process and a local Ray instance of its own (2 CPUs), the trees taking
turns, so the machine's load falls on both alike. Every process of the Ray instance is sampled
from /proc while a run lasts, so the CPU-seconds of each process (trial actor, Train controller,
worker, Ray Train's helper actors, Ray's daemons, the driver) add up to the run's total. A run's
start-up is its total CPU (and wall time) minus the in-process `fit()`: what a Ray Train run
costs on top of the training itself. About 3 minutes per tree and repeat on 2 CPUs; CPU-seconds
vary by ~20% with the machine's load, the before/after ratio less.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

# the vacsr tree under test: this checkout, or the one tree_runs names
sys.path.insert(0, os.environ.get("VACSR_BENCH_TREE", str(Path(__file__).resolve().parents[1])))

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


def tune_trial(config, folder: Path):
    """One trial the way a sweep runs it: Tuner -> run_trial, MLflow on. The
    driver's imports and the parent MLflow run come first, outside the measured `run()`: a sweep's
    dataset task pays them once, not per trial."""
    from ray import tune

    from vacsr.records import MlflowTracker
    from vacsr.sweep.search.trial import TrialMeta, run_trial

    folder.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    parent = MlflowTracker(uri).start("vacsr-bench", "eurosat")
    meta = TrialMeta(dataset="eurosat", trial_root=str(folder / "trials"),
                     ray_storage=str(folder / "ray"), tracking_uri=uri,
                     experiment="vacsr-bench", parent_run_id=parent)
    try:  # what a sweep reserves: a one-worker trial's actor holds the worker's share
        from vacsr.sweep.plan.plan import trial_resources

        resources = trial_resources(config.train, 0.1)
    except ImportError:  # an older tree: every trial actor drove a TorchTrainer on 0.1 CPU
        resources = {"CPU": 0.1}
    trainable = tune.with_resources(tune.with_parameters(run_trial, base=config, meta=meta),
                                    resources)
    tuner = tune.Tuner(trainable, tune_config=tune.TuneConfig(num_samples=1),
                       run_config=tune.RunConfig(name="bench", verbose=0,
                                                 storage_path=str(folder / "tune")))

    def run() -> dict:
        results = tuner.fit()
        if results.errors:
            raise RuntimeError(f"the trial failed: {results.errors[0]}")
        return {"train_loss": results[0].metrics["train/loss"]}

    return run


def plain_fit_ray(config, folder: Path):
    """`vacsr train --ray`'s path (imports first, outside the measured `run()`: the driver
    reads the final checkpoint with torch, once per process)."""
    from vacsr.distributed.train import fit_ray
    from vacsr.train.loop import TrainResult  # noqa: F401

    config.train.output_dir = str(folder)
    return lambda: {"train_loss": fit_ray(config).final_metrics["train/loss"]}


def final_seed_in_actor(config, folder: Path):
    """A sweep's final seed run of one worker: trained in the first evaluation actor that then
    scores it (`PoolScorer.train`), the actor started and stopped inside the measured `run()`
    as a dataset's final phase does. None for a tree whose final seeds all ran on fit_ray."""
    try:
        from vacsr.distributed.pool_scorer import PoolScorer
    except ImportError:
        return None
    if not hasattr(PoolScorer, "train"):
        return None
    from vacsr.train.checkpoint import load_checkpoint

    config.train.output_dir = str(folder)

    def run() -> dict:
        scorer = PoolScorer(1, config.train.cpus_per_worker)
        try:
            checkpoint, _ = scorer.train(config)
        finally:
            scorer.shutdown()
        return {"train_loss": load_checkpoint(checkpoint)["history"][-1]["train/loss"]}

    return run


# ------------------------------------------------------------------ measuring
def measure(run, sampler: ProcessSampler) -> dict:
    """Wall time of `run()` and the CPU-seconds of every process it involved, by role."""
    since = sampler.window()
    own0, sampler0 = time.process_time(), sampler.own_cpu
    start = time.perf_counter()
    result = run()
    wall = time.perf_counter() - start
    time.sleep(1.0)  # the run's actors exit: their last CPU is sampled
    sampler.poll()
    roles = defaultdict(float)
    for cpu, titles in sampler.cpu_by_process(since).values():
        roles[role_of(titles)] += cpu
    roles["driver"] = time.process_time() - own0 - (sampler.own_cpu - sampler0)
    return {"wall": wall, "cpu": sum(roles.values()), "roles": dict(roles), **result}


def start_ray() -> None:
    """A local Ray instance of 2 CPUs (as the embedded sweep on this machine)."""
    from vacsr.distributed.cluster import ensure_ray, quiet_logging

    quiet_logging()
    ensure_ray(num_cpus=2, log_to_driver=False)
    try:  # a tree whose sweep driver starts a shared placement-group cleaner: as it does
        from vacsr.distributed.placement import start_cleaner
    except ImportError:
        return
    start_cleaner()


def ray_runs(root: Path, folder: Path, repeats: int) -> dict[str, dict]:
    """`repeats` Tune trials and one fit_ray run of this process's vacsr tree, in one Ray
    instance. A throw-away first trial starts Ray's once-per-cluster actors, which no later run
    pays for."""
    import ray

    start_ray()
    sampler = ProcessSampler()
    sampler.start()
    runs = {}
    try:
        tune_trial(make_config(root, folder / "x"), folder / "warm-up")()
        for i in range(repeats):
            run = tune_trial(make_config(root, folder / "x"), folder / f"t{i}")
            runs[f"Tune trial {i + 1}"] = measure(run, sampler)
        runs["fit_ray"] = measure(plain_fit_ray(make_config(root, folder / "x"), folder / "f"),
                                  sampler)
        in_actor = final_seed_in_actor(make_config(root, folder / "x"), folder / "a")
        if in_actor is not None:
            runs["final seed in actor"] = measure(in_actor, sampler)
    finally:
        sampler.stop_event.set()
        ray.shutdown()
    return runs


def tree_runs(tree: Path, root: Path, folder: Path, repeats: int) -> dict[str, dict]:
    """ray_runs in a fresh interpreter that imports vacsr from `tree` (as do its Ray workers,
    which inherit PYTHONPATH)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "VACSR_BENCH_TREE": str(tree)}
    proc = subprocess.run([sys.executable, __file__, "--ray-child", str(root), str(folder),
                           str(repeats)], env=env, cwd=tree, capture_output=True, text=True,
                          timeout=1800, check=False)
    if proc.returncode:
        raise RuntimeError(f"Ray runs of {tree} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ report
def _fmt_imports(found: dict[str, float]) -> str:
    return ", ".join(f"{m} {s:.1f}" for m, s in sorted(found.items(), key=lambda x: -x[1])) or "-"


def _mean(runs: list[dict], key) -> float:
    return sum(key(r) for r in runs) / len(runs)


def report(local: dict, runs: dict[str, dict], trees: list[str]) -> None:
    fit_cpu, fit_wall = local["fit_cpu"], local["fit_wall"]
    print(f"in-process Trainer(config).fit(): fit {fit_cpu:.1f} CPU-s ({fit_wall:.1f} s); its "
          f"imports {local['import_cpu']:.1f} CPU-s: {_fmt_imports(local['imports'])} (s)")
    print(f"\nCPU-seconds per process; start-up = run - in-process fit\n"
          f"{'run':<26}{'wall s':>7}{'CPU s':>7}{'start-up':>9}{'wall':>6}  "
          + " ".join(f"{c[:10]:>10}" for c in COLUMNS))
    for name, run in runs.items():
        print(f"{name:<26}{run['wall']:>7.1f}{run['cpu']:>7.1f}{run['cpu'] - fit_cpu:>9.1f}"
              f"{run['wall'] - fit_wall:>6.1f}  "
              + " ".join(f"{run['roles'].get(c, 0.0):>10.1f}" for c in COLUMNS))
    for kind in ("Tune trial", "fit_ray", "final seed in actor"):
        means = {}
        for tree in trees:
            mine = [r for n, r in runs.items() if n.startswith(f"{tree} {kind}")]
            if not mine:  # a tree without this kind of run
                continue
            means[tree] = (_mean(mine, lambda r: r["cpu"] - fit_cpu),
                           _mean(mine, lambda r: r["wall"] - fit_wall))
        line = ", ".join(f"{tree} {cpu:.1f} CPU-s ({wall:.1f} s wall)"
                         for tree, (cpu, wall) in means.items())
        if len(means) == 2:
            (b, _), (a, _) = means[trees[0]], means[trees[1]]
            line += f": after / before = {a / b:.2f} (CPU)"
        print(f"{kind} start-up, mean: {line}")
    losses = {name: run["train_loss"] for name, run in runs.items()}
    same = all(loss == local["train_loss"] for loss in losses.values())
    print(f"\ntrain/loss in process {local['train_loss']!r}; every Ray run "
          + ("the same" if same else f"NOT the same: {losses}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("ROOT", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--ray-child", nargs=3, metavar=("ROOT", "OUT", "N"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=2,
                        help="turns per tree (one Tune trial, one fit_ray run and one final "
                             "seed in an evaluation actor each)")
    parser.add_argument("--before", type=Path, help="an older vacsr checkout to compare with")
    args = parser.parse_args()
    if args.child:
        return child(Path(args.child[0]), Path(args.child[1]))
    if args.ray_child:
        root, out, repeats = args.ray_child
        return print(json.dumps(ray_runs(Path(root), Path(out), int(repeats))))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from vacsr.data.generate import generate_all

    trees = {"after": Path(__file__).resolve().parents[1]}
    if args.before:
        trees = {"before": args.before.resolve(), **trees}
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        generated = generate_all(folder / "data", datasets=["eurosat"], per_class=(4, 3, 2))
        # a copy of the data per tree: each writes its own few-shot cache, and an older tree
        # cannot read a newer cache format
        roots = {name: shutil.copytree(generated, folder / f"data-{name}") for name in trees}
        local = in_process(roots["after"], folder / "local")
        for turn in range(args.repeats):
            for name, tree in trees.items():
                found = tree_runs(tree, roots[name], folder / f"{name}{turn}", 1)
                runs.update({f"{name} {kind} {turn + 1}": found[measured] for kind, measured in
                             (("Tune trial", "Tune trial 1"), ("fit_ray", "fit_ray"),
                              ("final seed in actor", "final seed in actor"))
                             if measured in found})
    report(local, runs, list(trees))


if __name__ == "__main__":
    main()
