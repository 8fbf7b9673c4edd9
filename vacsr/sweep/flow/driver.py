"""The sweep driver (paper sec. 4.1, appendix C): per dataset a Tune + Optuna search of Ray Train
trials, the best config re-run on seeds and evaluated, then the table, all recorded in MLflow.

Each dataset runs as a Ray task of its own (its Tuner, Optuna sampler and final runs in one
process); the driver starts as many as the cluster holds, shows their progress, records each
finished dataset in sweep_state.json at once (so a killed driver resumes after it), and on
SIGTERM / Ctrl-C / SIGHUP cancels them and closes everything it opened.

MLflow layout: experiment `vacsr-<kind>`; a parent run per sweep (the table's average row); a
child per dataset (searched keys as params, per-seed test metrics `test_seed/*`, its table row
`table/*`, the selection's `best_*`, best config YAML); under it a child per trial and per final
seed run. With --methods a dataset is a unit `<dataset>.<method>`, and a run per method holds
its average row of the comparison (vacsr/records/comparison_view.py).
"""
from __future__ import annotations

import shlex
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import ray

from vacsr.atomic import atomic_write_text
from vacsr.distributed.cluster import ensure_ray, quiet_logging
from vacsr.errors import StorageError, VacsrError
from vacsr.model.pretrained_cache import weights_record
from vacsr.records import MlflowTracker, redact_uri
from vacsr.records.artifacts import COMPARISON_INFO, SWEEP_COST, SWEEP_INFO
from vacsr.records.comparison_view import comparison_link
from vacsr.records.sweep_records import SweepRecords
from vacsr.records.sweep_state import SweepState
from vacsr.records.view import runs_link
from vacsr.results import table_spec
from vacsr.stop import SignalNote, Stopped
from vacsr.sweep.cost.measure import measure_sweep_cost
from vacsr.sweep.cost.sweep_cost import unit_paces
from vacsr.sweep.flow.dataset_task import run_dataset
from vacsr.sweep.flow.events import EventSink, start_event_log
from vacsr.sweep.plan.folders import error_file, run_folders, state_file
from vacsr.sweep.plan.ownership import claim_state, fixed_concurrency
from vacsr.sweep.plan.plan import SweepPlan, short_of, sweep_parallelism, trial_needs
from vacsr.sweep.plan.studies import (
    check_optuna_storage,
    fail_running_trials,
    open_optuna_storage,
    study_name,
)
from vacsr.sweep.report.methods_report import comparison_info
from vacsr.sweep.report.progress import SweepProgress
from vacsr.sweep.report.publish import publish_sweep
from vacsr.sweep.search.recovery import SpaceReserve, storage_failure, tracking_failure
from vacsr.sweep.search.resume_files import check_resume_files
from vacsr.train.scratch import clear_scratch


class SweepInterrupted(VacsrError):
    """SIGTERM, SIGINT or SIGHUP reached the driver; exit status 128 + the signal's number."""

    def __init__(self, signum: int, starting: bool = False, measuring: bool = False) -> None:
        done = ("while Ray started, before any run" if starting
                else "while the costs were measured, before any run" if measuring
                else "runs closed as KILLED")
        super().__init__(f"stopped by {signal.Signals(signum).name}; {done}, continue with "
                         "--resume")
        self.exit_code = 128 + signum


class SweepStorageFull(VacsrError):
    """A write of the sweep failed for want of space (or on a failing disk): the sweep stops,
    its records closed, and `--resume` continues it once there is room."""

    def __init__(self, storage: Path, where: str, closed: bool) -> None:
        records = ("runs closed as KILLED" if closed else
                   "its records could not be closed here, --resume closes them")
        super().__init__(f"{storage}: the sweep stopped on a storage error ({where}); "
                         f"{records}; free space, then continue with --resume")


class SweepTrackingDown(VacsrError):
    """The MLflow server stopped answering: the sweep stops, and `--resume` continues it (and
    closes its runs) once the server is back."""

    def __init__(self, uri: str, why: str) -> None:
        super().__init__(f"--tracking-uri {redact_uri(uri)}: the MLflow server stopped answering "
                         f"({why}); the sweep stopped, its runs stay open until --resume: "
                         "restart the server, then continue with --resume")


@dataclass
class SweepOutcome:
    rows: list[dict]
    failed: dict[str, str] = field(default_factory=dict)


class StopRequest(SignalNote):
    """SIGTERM / SIGINT / SIGHUP noted by the handler and raised by the driver's loop as the
    sweep's stop (vacsr.stop.SignalNote)."""

    def check(self) -> None:
        if self.signum is not None:
            raise SweepInterrupted(self.signum)


def _run_datasets(plan: SweepPlan, state: SweepState, parent_id: str,
                  progress: SweepProgress, stop: StopRequest,
                  order: list[str]) -> dict[str, str]:
    """Every pending dataset as a Ray task, `parallel` at a time, in `order` (the estimate's,
    longest first: sweep_cost.longest_first); returns the failed ones."""
    resources = ray.cluster_resources()
    parallel, per_dataset = sweep_parallelism(plan, resources)
    train = plan.configs[plan.datasets[0]].train
    short = short_of(trial_needs(train, plan.trial_cpus), resources)
    if short:  # a cluster's autoscaler may add such a node (a local instance is refused earlier)
        progress.line(f"[{plan.name}] note: one trial needs " + ", ".join(
            f"{need:g} {name}s, the cluster has {held:g}" for name, (need, held) in short.items())
            + " now: the sweep waits for the autoscaler to add nodes")
    rank = {unit: i for i, unit in enumerate(order)}
    pending = sorted((d for d in plan.datasets if not state.dataset(d).get("done")),
                     key=lambda d: rank.get(d, len(rank)))
    units = "dataset(s)" if len(plan.methods) == 1 else "dataset x method unit(s)"
    progress.line(f"[{plan.name}] {len(pending)} {units} to search, {parallel} at a time, "
                  f"{per_dataset} concurrent trial(s) each, {plan.trials} trials per dataset"
                  + ("" if len(set(map(plan.trials_of, plan.datasets))) == 1
                     else " (1 where nothing is searched)"))
    if plan.free_running and per_dataset > 1:
        progress.line(f"[{plan.name}] note: --free-running with {per_dataset} trials of a "
                      "dataset at once: Optuna's draws and ASHA's stops depend on which trial "
                      "reports first, so two runs of this sweep may select differently")
    events = start_event_log(plan.name)
    task = ray.remote(num_cpus=0, max_retries=0)(run_dataset)
    running: dict = {}
    failed: dict[str, str] = {}
    try:
        while pending or running:
            stop.check()
            while pending and len(running) < parallel:
                dataset = pending.pop(0)
                run_id = _dataset_run(plan, state, dataset, parent_id)
                running[task.remote(plan, dataset, run_id, per_dataset,
                                    EventSink(plan.name))] = dataset
                progress.started(dataset)
            ready, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
            for event in ray.get(events.drain.remote()):
                progress.event(event)
            for ref in ready:
                dataset = running.pop(ref)
                why = _finish_dataset(plan, state, dataset, ref)
                if why:
                    failed[dataset] = why
                progress.finished(dataset, why)
            progress.tick()
    except BaseException:
        for ref in running:
            ray.cancel(ref, force=True, recursive=True)
        raise
    finally:
        ray.kill(events)
    return failed


def _dataset_run(plan: SweepPlan, state: SweepState, dataset: str, parent_id: str) -> str:
    """The dataset's run, started crash-safely (vacsr/records/sweep_state.py) before its task."""
    return SweepRecords(plan.tracking_uri, plan.kind.experiment).start_dataset_run(
        state, dataset, plan.name, parent_id, plan.method_of(dataset), tags=plan.run_tags)



def _finish_dataset(plan: SweepPlan, state: SweepState, dataset: str, ref) -> str | None:
    """Record a finished dataset task; its failure as one line (the sweep goes on), with the
    whole traceback kept in <sweep folder>/errors/<dataset>.txt."""
    try:
        result = ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        full = storage_failure(exc)
        if full:  # not the dataset's fault: the sweep stops and resumes it (run_sweep)
            raise StorageError(f"{dataset}: {full}") from None
        if tracking_failure(exc):  # nor is this: run_sweep stops the sweep
            raise
        cause = exc.cause if isinstance(exc.cause, BaseException) else exc
        lines = str(cause).strip().splitlines()
        why = lines[-1][:300] if lines else repr(cause)
        if not isinstance(cause, VacsrError):  # a bug, not a bad input: keep the traceback
            path = atomic_write_text(error_file(plan.storage, dataset), str(exc))
            why = f"{type(cause).__name__}: {why} (traceback: {path})"
        state.update(dataset, failed=why)
        records = SweepRecords(plan.tracking_uri, plan.kind.experiment)
        records.note_failure(state.dataset(dataset)["run_id"], why)  # as the report says it
        close_left_open(plan, state, [dataset], "FAILED")  # nothing RUNNING for a resume
        return why
    state.update(dataset, done=True, result=result, failed=None)
    return None


def close_left_open(plan: SweepPlan, state: SweepState, datasets: list[str],
                    status: str) -> None:
    """What a stop (or a dataset's failure) left open, the one place it is closed: each
    unfinished dataset's run `status` (KILLED, FAILED) with its trial and seed runs KILLED, and
    its Optuna trials FAIL, so that a later --resume starts from clean records."""
    records = SweepRecords(plan.tracking_uri, plan.kind.experiment)
    storage = open_optuna_storage(plan)
    try:
        for dataset in datasets:
            entry = state.dataset(dataset)
            if entry.get("run_id") and not entry.get("done"):
                records.close_dataset_run(entry["run_id"], status)
            fail_running_trials(storage, study_name(plan.name, dataset))
    finally:
        storage.engine.dispose()


def _close_records(plan: SweepPlan, state: SweepState, parent: MlflowTracker, status: str,
                   tolerate: bool) -> bool:
    """Close the unfinished datasets' records and the sweep's run; with `tolerate` (the disk is
    full) a failure to do so is reported by the caller's line, not raised: a resume closes them."""
    try:
        close_left_open(plan, state, plan.datasets, "KILLED")
        parent.finish(status)
    except Exception:
        if not tolerate:
            raise
        return False
    return True


def _start(plan: SweepPlan, stop: StopRequest) -> SweepState:
    """The sweep's folder claimed and Ray started; a stop meanwhile (noted by `stop`, or caught
    by Ray's own handler within ray.init: vacsr/distributed/cluster.py) shuts down what started."""
    try:
        plan.storage.mkdir(parents=True, exist_ok=True)
        # a used folder takes only --resume, with its own settings and readable files
        state = claim_state(plan, check_resume_files)
        # what killed runs left of their temporary copies (vacsr/train/scratch.py): nothing
        # trains yet
        clear_scratch(*run_folders(plan.storage))
        state.update(weights=weights_record(plan.configs[plan.datasets[0]].model.pretrained))
        quiet_logging(plan.verbose)
        ensure_ray(address=plan.ray_address, include_dashboard=plan.ray_dashboard,
                   log_to_driver=plan.verbose)
        stop.check()
        return state
    except BaseException as exc:
        stop.restore()
        if not plan.ray_address:
            ray.shutdown()
        signum = getattr(exc, "signum", None) or stop.signum
        if isinstance(exc, (Stopped, SweepInterrupted)) and signum:
            raise SweepInterrupted(signum, starting=True) from None
        raise


def _measured_cost(plan: SweepPlan, stop: StopRequest) -> dict:
    """The cost estimate, measured where the trials run; a configuration too large for the
    device ends the sweep here, its folder left unused (a new sweep may start there once it is
    fixed). A stop meanwhile ends it as a stop while Ray started: --resume continues."""
    def stop_check() -> None:
        if stop.signum is not None:
            raise SweepInterrupted(stop.signum, measuring=True)

    try:
        return measure_sweep_cost(plan, stop_check, keep_in_folder=True)
    except SweepInterrupted:
        raise
    except VacsrError:
        if not plan.resume:
            state_file(plan.storage).unlink(missing_ok=True)
        raise


def run_sweep(plan: SweepPlan) -> SweepOutcome:
    """The whole sweep; returns the table rows (also printed and logged to the parent run)."""
    stop = StopRequest()  # first: a stop while Ray starts is the sweep's too, said in one line
    state = _start(plan, stop)
    try:
        plan = fixed_concurrency(plan, state, ray.cluster_resources())
        check_optuna_storage(plan)  # the schema is created here once, not by racing dataset tasks
        cost = _measured_cost(plan, stop)
        if plan.rehearse:  # the runs' clocks, from the costs just measured
            from vacsr.sweep.rehearsal.clock import start_rehearsal

            print(start_rehearsal(plan, cost), flush=True)
        parent = SweepRecords(plan.tracking_uri, plan.kind.experiment).start_sweep_run(
            state, plan.name, plan.kind.name, plan.methods, tags=plan.run_tags)
    except BaseException:
        stop.restore()
        raise
    parent_id = parent.run_id
    if len(plan.methods) > 1:  # beside its vacsr.method tag (a one-method sweep's is unchanged)
        parent.log_params({"method": ",".join(plan.methods)})
        parent.log_json(COMPARISON_INFO, comparison_info(plan))  # for `vacsr best --compare`
    parent.log_json(SWEEP_INFO, {"kind": plan.kind.name, "metric": plan.kind.metric,
                                 "table": table_spec(plan.kind.table)})
    parent.log_json(SWEEP_COST, cost)
    SweepRecords.note_costs_source(parent, cost["costs_from"])
    done = [d for d in plan.datasets if state.dataset(d).get("done")]
    progress = SweepProgress(plan.name, plan.datasets, plan.trials_of, done, plan.kind.metric,
                             unit_costs=unit_paces(cost), lanes=cost["parallel_datasets"])
    reserve = SpaceReserve(plan.storage)
    try:
        reserve.hold()  # room to close the records if the disk fills up (search/recovery.py)
        failed = _run_datasets(plan, state, parent_id, progress, stop, cost["unit_order"])
        stop.check()
    except BaseException as exc:
        progress.close()
        for signum in stop.previous:  # the clean-up itself is not interrupted
            signal.signal(signum, signal.SIG_IGN)
        reserve.release()
        full, down = storage_failure(exc), tracking_failure(exc)
        if not down:  # a server that does not answer closes nothing: --resume closes them
            closed = _close_records(plan, state, parent,
                                    "KILLED" if full or isinstance(exc, (SweepInterrupted,
                                                                         KeyboardInterrupt))
                                    else "FAILED", tolerate=bool(full))
        if not plan.ray_address:
            ray.shutdown()
        if full:
            raise SweepStorageFull(plan.storage, full, closed) from None
        if down:
            raise SweepTrackingDown(plan.tracking_uri, down) from None
        raise
    finally:
        stop.restore()
    reserve.release()
    progress.close()
    rows, text = publish_sweep(plan, state, parent, failed)
    parent.finish("FAILED" if failed else "FINISHED")
    print("\n" + text, flush=True)
    return SweepOutcome(rows=rows, failed=failed)


UI_ADDRESS = "http://127.0.0.1:5000"  # where `mlflow ui` serves by default


def mlflow_ui_hint(uri: str, experiment_id: str | None = None, sweep: str | None = None) -> str:
    """The command that serves the store, and the link to open: the sweep's saved view (its runs
    with the table's metrics as columns), else its runs filtered (vacsr/records/view.py)."""
    # shown without its password; the store is read with it (a server behind auth answers 401
    # to the redacted form)
    # this interpreter's MLflow: `mlflow` itself is on PATH only inside an activated venv
    command = f"{shlex.quote(sys.executable)} -m mlflow ui --backend-store-uri"
    hint = f"{command} {shlex.quote(redact_uri(uri))}   # then open {UI_ADDRESS}"
    return hint if experiment_id is None else hint + runs_link(uri, experiment_id, sweep)


def comparison_hint(uri: str, experiment_id: str, sweep: str) -> str | None:
    """The link to the sweep's method comparison view on the server mlflow_ui_hint starts; None
    when the sweep saved none (vacsr/records/comparison_view.py)."""
    link = comparison_link(uri, experiment_id, sweep)
    return None if link is None else UI_ADDRESS + link
