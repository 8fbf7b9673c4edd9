"""One dataset's search: Tune + Optuna over Ray Train trials, then the best trial (paper sec. 4.1,
appendix C: selection on the validation split only).

Runs inside the dataset's Ray task (vacsr/sweep/flow/dataset_task.py): each dataset's Tuner
lives in a process of its own, so datasets searched side by side share no Tune or Optuna state.
"""
from __future__ import annotations

import math
import zlib
from typing import Any, Callable

import ray
from ray import tune

from vacsr.distributed.storage_fs import ray_storage
from vacsr.errors import VacsrError
from vacsr.records.sweep_records import SweepRecords
from vacsr.results import PREFIX_CACHE_REBUILT
from vacsr.sweep.plan.folders import (
    TRIALS,
    TUNE,
    asha_rungs_file,
    join_storage,
    trial_folder,
    tune_experiment,
)
from vacsr.sweep.plan.plan import SweepPlan, trains_in_trial, trial_resources
from vacsr.sweep.plan.studies import fail_running_trials, open_optuna_storage, study_name
from vacsr.sweep.search.asha import OrderedASHA
from vacsr.sweep.search.optuna_searcher import OptunaStudySearch
from vacsr.sweep.search.recovery import (
    TRACKING_DOWN_NOTE,
    repair_experiment,
    restore_named_checkpoints,
    tracking_failure,
)
from vacsr.sweep.search.rung_gate import GateSpec, gate_name, open_gate, wait_note
from vacsr.sweep.search.rungs import RungLedger
from vacsr.sweep.search.selection import (
    creation_order,
    read_selection,
    select_best,
    write_selection,
)
from vacsr.sweep.search.trial import CHECKPOINT_PATH_KEY, TrialMeta, run_trial, with_suggestions
from vacsr.sweep.spec.schedule import ASHA, longest_epochs
from vacsr.sweep.spec.space import DefineByRun, start_point
from vacsr.train.run_files import CHECKPOINT_FILE


class TrackingUnavailable(VacsrError):
    """A trial stopped because the MLflow server did not answer: the sweep stops (the driver
    says so in one line) and --resume trains the trial again."""


def sampler_seed(sweep_seed: int, dataset: str) -> int:
    """Optuna's seed for one dataset: from the sweep seed and the name, so datasets do not all
    draw the same first configurations, and a rerun draws the same ones again. Every method's
    unit of a dataset takes the dataset's (`--methods`): VACSR's searches in a comparison are
    those of a sweep of VACSR alone."""
    return zlib.crc32(f"{sweep_seed}:{dataset}".encode()) % 2**31


def _trainable(plan: SweepPlan, dataset: str, dataset_run_id: str, gate: GateSpec | None) -> str:
    """The dataset's trial function, registered under a name of its own: Tune keeps trainables
    per job and name, and the datasets' tasks share the driver's job, so one shared name would
    let a dataset's trials run another dataset's config."""
    meta = TrialMeta(dataset=dataset, trial_root=str(trial_folder(plan.storage, dataset)),
                     ray_storage=plan.ray_path(TRIALS, dataset), tracking_uri=plan.tracking_uri,
                     experiment=plan.kind.experiment, parent_run_id=dataset_run_id,
                     rehearsal=plan.clocks.get(dataset),
                     gate=gate)
    trainable = tune.with_parameters(run_trial, base=plan.configs[dataset], meta=meta)
    name = f"vacsr-{plan.name}-{dataset}"
    resources = trial_resources(plan.configs[dataset].train, plan.trial_cpus)
    tune.register_trainable(name, tune.with_resources(trainable, resources))
    return name


def rung_ledger(plan: SweepPlan, dataset: str) -> RungLedger:
    """The dataset's ASHA rungs and decisions, in its trial folder."""
    base, space = plan.configs[dataset], plan.spaces[dataset]
    return RungLedger(asha_rungs_file(plan.storage, dataset), ASHA,
                      longest_epochs(space, base.train.epochs), plan.kind.mode)


def rung_gate_spec(plan: SweepPlan, dataset: str, experiment: str,
                   max_concurrent: int) -> GateSpec | None:
    """Where the dataset's trials wait for their rungs' decisions in their actors; None where no
    trial waits in its actor: free-running ASHA never waits, a trial of several Ray Train workers
    reports from them, not from its actor (it is paused instead), and one trial at a time finds
    every earlier trial ended, so each rung's decision is there when it reports (no gate actor,
    no process of its own to start; vacsr/sweep/search/rung_gate.py)."""
    if plan.free_running or not trains_in_trial(plan.configs[dataset].train):
        return None
    if min(max_concurrent, plan.trials_of(dataset)) <= 1:
        return None
    return GateSpec(gate_name(experiment), tuple(rung_ledger(plan, dataset).rungs))


def study_search(plan: SweepPlan, dataset: str, storage) -> OptunaStudySearch:
    """The dataset's searcher on its Optuna study in `storage`: the base config first, then the
    plan's draws (its sampler seed, start-up trials, slack and ordering)."""
    base, space = plan.configs[dataset], plan.spaces[dataset]
    return OptunaStudySearch(DefineByRun(space), metric=plan.kind.metric, mode=plan.kind.mode,
                             storage=storage, study_name=study_name(plan.name, dataset),
                             seed=sampler_seed(plan.sampler_seed, plan.dataset_of(dataset)),
                             points_to_evaluate=[start_point(space, base)],
                             num_samples=plan.trials_of(dataset), ordered=not plan.free_running,
                             startup_trials=plan.startup_trials, draw_slack=plan.draw_slack)


def _tuner(plan: SweepPlan, dataset: str, experiment: str, trainable, storage,
           max_concurrent: int, gate: GateSpec | None,
           report: Callable[[dict], None]) -> tune.Tuner:
    """A new Tuner, or the restored one when --resume finds this dataset's `experiment`; its
    progress events go to `report`."""
    storage_path, filesystem = ray_storage(plan.ray_path(TUNE))  # whole files (storage_fs.py)
    folder = join_storage(storage_path, experiment)
    storage_failed = plan.resume and repair_experiment(folder)  # what a full disk left
    if plan.resume and tune.Tuner.can_restore(folder, storage_filesystem=filesystem):
        # errored trials stay failed, their errors are deterministic (worker loss is retried by
        # Ray Train inside the trial), unless a full disk stopped them (search/recovery.py)
        tuner = tune.Tuner.restore(folder, trainable=trainable, resume_unfinished=True,
                                   resume_errored=storage_failed, restart_errored=False,
                                   storage_filesystem=filesystem)
        for line in restore_named_checkpoints(tuner.get_results(), CHECKPOINT_FILE):
            report({"event": "note", "dataset": dataset, "text": line})
        return tuner
    base = plan.configs[dataset]
    search = study_search(plan, dataset, storage)
    # a trial that trains in its actor is restarted by Tune when the actor is lost (Ray Train
    # restarts the workers of the others); its own errors end at once
    # (vacsr/sweep/search/trial_run.py)
    in_actor = trains_in_trial(base.train)
    retries = base.train.max_failures if in_actor else 0
    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            metric=plan.kind.metric, mode=plan.kind.mode, search_alg=search,
            num_samples=plan.trials_of(dataset),
            # the schedule the cost estimate reads too (vacsr/sweep/spec/schedule.py), each
            # decision in the searcher's creation order (vacsr/sweep/search/rungs.py)
            scheduler=OrderedASHA(rung_ledger(plan, dataset), search, time_attr="epoch",
                                  ordered=not plan.free_running, gate=gate and gate.name),
            max_concurrent_trials=max_concurrent,
            # the next trial trains in the actor (and process) the last one ended in: no second
            # start-up of Python, torch, open_clip and MLflow. Tune resets an actor only once its
            # trial's thread has ended (a stopped trial ends inside tune.report); a trial of
            # TorchTrainer workers gets an actor of its own
            reuse_actors=in_actor),
        run_config=tune.RunConfig(name=experiment, storage_path=storage_path,
                                  storage_filesystem=filesystem, verbose=0,
                                  callbacks=[TrialEvents(dataset, plan.kind.metric, report)],
                                  failure_config=tune.FailureConfig(max_failures=retries),
                                  checkpoint_config=tune.CheckpointConfig(num_to_keep=2)))


class TrialEvents(tune.Callback):
    """Each finished or failed trial as an event for the driver's progress display."""

    def __init__(self, dataset: str, metric: str, report: Callable[[dict], None]) -> None:
        self.dataset, self.metric, self.report = dataset, metric, report

    def _send(self, trial, status: str) -> None:
        result = trial.last_result or {}
        value = result.get(self.metric)
        for line in str(result.get(PREFIX_CACHE_REBUILT) or "").splitlines():  # a worker's log
            self.report({"event": "note", "dataset": self.dataset,
                         "text": f"trial {trial.trial_id}: prefix cache: {line}"})
        self.report({"event": "trial", "dataset": self.dataset, "trial": trial.trial_id,
                     "status": status, "epochs": result.get("epoch", 0),
                     "value": value if isinstance(value, (int, float)) else None,
                     "cache": (int(result.get("prefix_cache/served", 0)),
                               int(result.get("prefix_cache/evaluated", 0)))})

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._send(trial, "done")

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._send(trial, "FAILED")


def _error_line(error: Any) -> str | None:
    if error is None:
        return None
    text = str(error).strip().splitlines()
    return (text[-1] if text else type(error).__name__)[:300]


def _with_checkpoint_path(result) -> dict:
    """A trial's last metrics with the path of its last checkpoint: TuneReportCallback puts it in
    the metrics (Ray Train stored the checkpoint); a trial that trains in its actor reported the
    checkpoint to Tune, which stored it (`Result.checkpoint`)."""
    metrics = dict(result.metrics or {})
    if CHECKPOINT_PATH_KEY not in metrics and result.checkpoint is not None:
        metrics[CHECKPOINT_PATH_KEY] = result.checkpoint.path
    return metrics


def _at_stop(result, stops: dict[str, dict], metric: str) -> dict:
    """A trial's last metrics; for one ASHA stopped, its value and epoch at the stop rung (a
    trial restarted on --resume may report an epoch more before its stop reaches it)."""
    metrics = _with_checkpoint_path(result)
    stop = stops.get(str(metrics.get("trial_id")))
    return {**metrics, metric: stop["value"], "epoch": stop["rung"]} if stop else metrics


def search_dataset(plan: SweepPlan, dataset: str, dataset_run_id: str, max_concurrent: int = 1,
                   report: Callable[[dict], None] = lambda event: None) -> dict:
    """Run (or resume) the dataset's search; the best trial's config, val metric and checkpoint.
    A resumed sweep whose search of this dataset was done takes the recorded choice."""
    folder = trial_folder(plan.storage, dataset)
    recorded = read_selection(folder) if plan.resume else None
    selection = recorded or _search(plan, dataset, dataset_run_id, max_concurrent, report)
    if recorded is None:
        write_selection(folder, selection)
    return {**selection, "config": with_suggestions(plan.configs[dataset], selection["suggested"])}


def _search(plan: SweepPlan, dataset: str, dataset_run_id: str, max_concurrent: int,
            report: Callable[[dict], None]) -> dict:
    """The search itself, its trials' MLflow runs closed and marked; the selection record."""
    storage = open_optuna_storage(plan)
    study = study_name(plan.name, dataset)
    experiment = tune_experiment(dataset, dataset_run_id)
    # one answer for the trials, the scheduler and the gate actor
    gate = rung_gate_spec(plan, dataset, experiment, max_concurrent)
    trainable = _trainable(plan, dataset, dataset_run_id, gate)
    tuner = _tuner(plan, dataset, experiment, trainable, storage, max_concurrent, gate, report)
    gate_actor = gate and open_gate(gate, rung_ledger(plan, dataset).verdicts())
    try:
        results = tuner.fit()
        note = gate_actor and wait_note(ray.get(gate_actor.stats.remote()))
        if note:
            report({"event": "note", "dataset": dataset, "text": note})
    finally:
        if gate_actor is not None:
            ray.kill(gate_actor)
    fail_running_trials(storage, study)  # a trial Tune restarted afresh leaves its old one behind
    for result in results:  # selecting among the trials the outage left would choose otherwise
        down = result.error is not None and tracking_failure(result.error)
        if down:
            raise TrackingUnavailable(f"{dataset}: a trial stopped: {TRACKING_DOWN_NOTE} ({down})")
    order = creation_order(storage, study)
    storage.engine.dispose()
    stops = rung_ledger(plan, dataset).stops()
    trials = [{"config": r.config or {}, "metrics": _at_stop(r, stops, plan.kind.metric),
               "error": _error_line(r.error), "trial_id": (r.metrics or {}).get("trial_id"),
               "order": order.get((r.metrics or {}).get("trial_id"), math.inf)}
              for r in results]
    SweepRecords(plan.tracking_uri, plan.kind.experiment).close_children(dataset_run_id)
    record_selection_values(plan.tracking_uri, plan.kind.experiment, dataset_run_id, dataset,
                            trials, plan.kind.metric, stops)
    best = select_best(trials, plan.kind.metric, plan.kind.mode)
    metrics = best["metrics"]
    epochs = with_suggestions(plan.configs[dataset], best["config"]).train.epochs
    finished = metrics.get("epoch") == epochs and metrics.get(CHECKPOINT_PATH_KEY)
    return {"trial_id": str(metrics.get("trial_id")), "suggested": best["config"],
            "val": metrics[plan.kind.metric], "num_trials": len(trials),
            "failed_trials": sum(t["error"] is not None for t in trials),
            # the trial ran every epoch (ASHA did not stop it): its last checkpoint is final
            "checkpoint": f"{metrics[CHECKPOINT_PATH_KEY]}/{CHECKPOINT_FILE}" if finished
            else None}


SELECTION_EPOCH_TAG = "vacsr.selection_epoch"
ASHA_RUNG_TAG = "vacsr.asha_stop_rung"  # the epoch at which ASHA stopped the trial
ASHA_COMPARED_TAG = "vacsr.asha_compared"  # the values reported at that rung before it


def selection_metric_name(metric: str) -> str:
    """"val/acc" -> "selection_val/acc": the value a trial is selected on, in its MLflow run."""
    return f"selection_{metric}"


def record_selection_values(uri: str, experiment: str, parent_run_id: str, dataset: str,
                            trials: list[dict], metric: str,
                            stops: dict[str, dict] | None = None) -> int:
    """Log on each trial's MLflow run the value selection compares (Tune's last result) and its
    epoch, and for a trial ASHA stopped, the rung and the values it was compared with. A stopped
    trial may log an epoch or two more before its workers stop; without this its latest MLflow
    `val/...` is a value selection never saw. Returns how many runs were marked."""
    records = SweepRecords(uri, experiment)
    runs = records.child_run_ids(parent_run_id)
    marked = 0
    for trial in trials:
        value, run_id = trial["metrics"].get(metric), runs.get(f"{dataset}-{trial['trial_id']}")
        if run_id is None or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        epoch = trial["metrics"].get("epoch")
        tags = {SELECTION_EPOCH_TAG: epoch}
        stop = (stops or {}).get(str(trial["trial_id"]))
        if stop:
            tags.update({ASHA_RUNG_TAG: stop["rung"],
                         ASHA_COMPARED_TAG: ", ".join(f"{v:g}" for v in stop["compared"])})
        records.mark_run(run_id, {selection_metric_name(metric): value}, int(epoch or 0), tags)
        marked += 1
    return marked
