"""A sweep's runs in its MLflow store: started, continued, closed and read back here (the sweep's
saved view, dataset inputs and store checks are view.py, inputs.py and uri.py of this package).

In the kind's experiment: the sweep's run, a run per dataset under it, and under each dataset
run its trials' and final seeds' runs (tag `mlflow.parentRunId`); with --methods also a run per
method under the sweep's holding that method's average row of the comparison. The driver starts
the sweep's, the datasets' and the average rows' runs crash-safely (sweep_state.json records
them: sweep_state.py), a dataset's Ray task continues its run by id, trials and seed runs open
their own (`place_child_run`), what a stop or a failure left RUNNING is closed here, and `vacsr
best` reads the sweep back by the artifact names of artifacts.py.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, RunTag

from vacsr.config import DEFAULT_METHOD
from vacsr.errors import ConfigError
from vacsr.records.names import MAX_PARAM_VALUE_LENGTH, METHOD_TAG, PARENT_TAG, REHEARSAL_TAG
from vacsr.records.sweep_state import AVERAGES, SweepState, start_recorded_run
from vacsr.records.tracker import MlflowTracker, open_tracker
from vacsr.records.uri import redact_uri, resolve_tracking_uri

SWEEP_TAG = "vacsr.sweep"  # every run of the sweep but its trials' and seeds'
KIND_TAG = "vacsr.kind"  # the sweep's own run
DATASET_TAG = "vacsr.dataset"  # a dataset's run
FAILED_TAG = "vacsr.failed"  # a dataset's run that failed: the one-line reason the report gives
# a dataset's run (or the sweep's) with no result yet that is no failure: closed by a stop
# (KILLED), or RUNNING, as a live driver keeps it and one killed outright leaves it; --resume
# continues it
UNFINISHED_STATUSES = ("RUNNING", "KILLED")
# the sweep's own run: where its plan's step costs came from at its latest start (measured now,
# the sweep folder, the machine cache: vacsr/sweep/cost/cost_store.py) and when they were measured
COSTS_FROM_TAG = "vacsr.costs_from"
COSTS_MEASURED_TAG = "vacsr.costs_measured_at"


def place_child_run(config, *, tracking_uri: str, experiment: str, parent_run_id: str,
                    run_name: str) -> None:
    """Make `config`'s run (a trial, a final seed run) a child of a dataset's run: the training
    opens it itself (TrackingCallback.from_config reads config.tracking)."""
    tracking = config.tracking
    tracking.enabled = True
    tracking.uri, tracking.experiment = tracking_uri, experiment
    tracking.parent_run_id, tracking.run_name = parent_run_id, run_name


class SweepRecords:
    """The runs of one experiment of the store at `tracking_uri`, as a sweep writes and reads
    them. Opens no run itself: its trackers are the runs' (`start_sweep_run`, `continue_run`)."""

    def __init__(self, tracking_uri: str | None, experiment: str) -> None:
        self.tracking_uri = resolve_tracking_uri(tracking_uri)
        self.experiment = experiment
        self._store: MlflowTracker | None = None

    @property
    def store(self) -> MlflowTracker:
        """A tracker that holds no run (the experiment, runs by id), opened on first use."""
        if self._store is None:
            self._store = open_tracker(self.tracking_uri)
        return self._store

    def experiment_id(self) -> str:
        """The experiment's id (created, or restored, if needed)."""
        return self.store.experiment_id(self.experiment)

    # ------------------------------------------------------------ the runs the driver opens
    def start_sweep_run(self, state: SweepState, sweep: str, kind: str,
                        methods: tuple[str, ...] = (DEFAULT_METHOD,),
                        tags: dict[str, Any] | None = None) -> MlflowTracker:
        """The sweep's own run, started or continued as sweep_state.json records it; the tracker
        that holds it (the driver logs the report to it and ends it). Its method tag names every
        method it runs; `tags`: the sweep's own (a rehearsal's REHEARSAL_TAG)."""
        tracker = open_tracker(self.tracking_uri)
        start_recorded_run(tracker, state, None, self.experiment, sweep,
                           tags={SWEEP_TAG: sweep, KIND_TAG: kind,
                                 METHOD_TAG: ",".join(methods), **(tags or {})})
        return tracker

    @staticmethod
    def note_costs_source(tracker: MlflowTracker, costs_from: dict[str, Any]) -> None:
        """On the sweep's run `tracker` holds: where the costs of its plan came from."""
        tracker.set_tag(COSTS_FROM_TAG, costs_from["source"])
        tracker.set_tag(COSTS_MEASURED_TAG, costs_from["measured_at"])

    def start_dataset_run(self, state: SweepState, dataset: str, sweep: str,
                          parent_run_id: str, method: str = DEFAULT_METHOD,
                          tags: dict[str, Any] | None = None) -> str:
        """A dataset's run under the sweep's, started or continued as sweep_state.json records
        it; its id (its Ray task continues it: `continue_run`). A run that failed before loses
        its reason (`note_failure`) as it starts again. `tags`: the sweep's own."""
        tracker = open_tracker(self.tracking_uri)
        run_id = start_recorded_run(tracker, state, dataset, self.experiment, dataset,
                                    parent_run_id=parent_run_id,
                                    tags={DATASET_TAG: dataset, SWEEP_TAG: sweep,
                                          METHOD_TAG: method, **(tags or {})})
        if (state.dataset(dataset).get("failed")
                and FAILED_TAG in tracker.client.get_run(run_id).data.tags):
            tracker.client.delete_tag(run_id, FAILED_TAG)
        return run_id

    def note_failure(self, run_id: str, why: str) -> None:
        """On a dataset's run: why it failed, as the sweep's report says (`vacsr best
        --compare` shows it)."""
        self.store.client.set_tag(run_id, FAILED_TAG, why[:MAX_PARAM_VALUE_LENGTH])

    def start_average_run(self, state: SweepState, method: str, sweep: str,
                          parent_run_id: str) -> MlflowTracker:
        """The run of a method's average row of the comparison (`average.<method>`, under the
        sweep's run), started or continued as sweep_state.json records it (a resume continues
        it, never opens a second one); the tracker that holds it."""
        tracker = open_tracker(self.tracking_uri)
        start_recorded_run(tracker, state, method, self.experiment, f"average.{method}",
                           AVERAGES, parent_run_id=parent_run_id,
                           tags={SWEEP_TAG: sweep, METHOD_TAG: method})
        return tracker

    def continue_run(self, run_id: str) -> MlflowTracker:
        """A tracker holding the existing run `run_id` (status back to RUNNING)."""
        return open_tracker(self.tracking_uri, run_id)

    # ------------------------------------------------------------ child runs
    def child_runs(self, parent_run_id: str, *, running_only: bool = False) -> list:
        """The runs under `parent_run_id` (a dataset run's trials and seed runs)."""
        running = " and attributes.status = 'RUNNING'" if running_only else ""
        return self.store.client.search_runs(
            [self.experiment_id()], filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'"
                                                  f"{running}")

    def child_run_ids(self, parent_run_id: str) -> dict[str, str]:
        """Run name -> run id of the runs under `parent_run_id`."""
        return {r.info.run_name: r.info.run_id for r in self.child_runs(parent_run_id)}

    def mark_run(self, run_id: str, metrics: dict[str, float], step: int,
                 tags: dict[str, Any]) -> None:
        """Metrics at `step` and tags on an existing run (not held), in one request."""
        now = int(time.time() * 1000)
        self.store.client.log_batch(
            run_id, metrics=[Metric(k, float(v), now, int(step)) for k, v in metrics.items()],
            tags=[RunTag(k, str(v)) for k, v in tags.items()])

    # ------------------------------------------------------------ what a stop left open
    def close_children(self, parent_run_id: str) -> int:
        """The runs under `parent_run_id` left RUNNING (trials ASHA stopped, runs of a killed
        driver) KILLED; returns how many."""
        runs = self.child_runs(parent_run_id, running_only=True)
        for run in runs:
            self.store.client.set_terminated(run.info.run_id, status="KILLED")
        return len(runs)

    def close_dataset_run(self, run_id: str, status: str) -> None:
        """What a stop or a failure left of a dataset's run: its trial and seed runs KILLED, the
        run itself `status` (KILLED, FAILED) unless it ended already."""
        self.close_children(run_id)
        if self.store.client.get_run(run_id).info.status == "RUNNING":
            self.store.client.set_terminated(run_id, status=status)

    # ------------------------------------------------------------ reading the sweep back
    def sweep_run(self, sweep: str | None):
        """The sweep's own run (the newest sweep's when `sweep` is None); ConfigError when the
        store holds none, or when it is a rehearsal's (REHEARSAL_TAG): its configs and numbers
        are never results. Creates nothing."""
        found = self.store.client.get_experiment_by_name(self.experiment)
        if found is None:
            held = sorted(e.name for e in self.store.client.search_experiments()
                          if e.name != "Default")
            raise ConfigError(f"MLflow experiment {self.experiment!r} not found in "
                              f"{redact_uri(self.tracking_uri)} (it holds: "
                              f"{', '.join(held) or 'no experiment'})")
        query = f"tags.`{KIND_TAG}` != ''" + (f" and tags.`{SWEEP_TAG}` = '{sweep}'"
                                               if sweep else "")
        runs = self.store.client.search_runs([found.experiment_id], filter_string=query,
                                             order_by=["attributes.start_time DESC"],
                                             max_results=1)
        if not runs:
            raise ConfigError(" ".join(f"no sweep {sweep or ''} in experiment "
                                       f"{self.experiment!r}".split()))
        scale = runs[0].data.tags.get(REHEARSAL_TAG)
        if scale is not None:
            name = runs[0].data.tags.get(SWEEP_TAG)
            raise ConfigError(f"sweep {name!r} in experiment {self.experiment!r} is a rehearsal "
                              f"(--rehearse {scale}): nothing in it trained, so it has no "
                              "results; run the sweep without --rehearse"
                              + ("" if sweep else ", or name a real sweep with --sweep"))
        return runs[0]

    def dataset_runs(self, sweep_run) -> list:
        """The datasets' runs under the sweep's run, oldest first."""
        return self.store.client.search_runs(
            [sweep_run.info.experiment_id],
            filter_string=f"tags.`{PARENT_TAG}` = '{sweep_run.info.run_id}' "
                          f"and tags.`{DATASET_TAG}` != ''",
            order_by=["attributes.start_time ASC"])

    def artifact(self, run_id: str, name: str) -> bytes:
        """The content of the run's artifact `name`. Downloaded into a folder removed at once:
        MLflow's own default is a new temporary folder per download, left behind for good."""
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per file
        with tempfile.TemporaryDirectory() as folder:
            return Path(self.store.client.download_artifacts(run_id, name, folder)).read_bytes()

    def artifact_json(self, run_id: str, name: str) -> dict | None:
        """The run's JSON artifact `name`; None when absent (its dataset did not finish)."""
        try:
            return json.loads(self.artifact(run_id, name))
        except Exception:
            return None
