"""The method comparison of a sweep of several methods (`--methods`) in the MLflow UI: a saved view
beside the sweep's results view (view.py), in the same form and under the same MLflow-release
guard, named `<sweep>: method comparison`.

Its rows are the comparison's (vacsr/sweep/report/comparison.py): one per dataset x method, the
unit's run (`<dataset>.<method>`), and one per method for its average row, a run of its own under
the sweep's run (`average.<method>`, SweepRecords.start_average_run: a resume continues it). Each
such run is tagged COMPARISON_ROW_TAG with the row's dataset, or `average (N datasets)`, and the
view finds them by that tag. Its columns: the dataset, the method (tag `vacsr.method`), the
table's metrics (`table/<column>` rounded as the report shows them: the units' from their own
table, view.publish_table, which the comparison's rows repeat; the averages' from the
comparison's average rows), the best val, then the searched keys of each chosen config.
"""
from __future__ import annotations

from vacsr.records.names import METHOD_TAG
from vacsr.records.sweep_records import SweepRecords
from vacsr.records.tracker import open_tracker
from vacsr.records.view import (
    ROW_TAG,
    TABLE_PREFIX,
    average_label,
    columns,
    log_once,
    save_view,
    searched_keys,
    sweep_filter,
    table_metrics,
    view_format_known,
    view_key,
    view_link,
    view_query,
    view_state,
)
from vacsr.results import VAL

COMPARISON_ROW_TAG = "vacsr.comparison_row"  # the comparison's row a run holds: its dataset, or
# average_label(N) on a method's average run
KEY_PREFIX = "vacsr_comparison-"  # never a results view's key ("vacsr-<sweep>")


def comparison_key(sweep: str) -> str:
    return view_key(sweep, KEY_PREFIX)


def comparison_filter(sweep: str) -> str:
    """The runs search that finds the comparison's rows: the sweep's runs that hold one."""
    return f"{sweep_filter(sweep)} and tags.`{COMPARISON_ROW_TAG}` != ''"


def publish_comparison(records: SweepRecords, state, parent_run_id: str, plan,
                       titles: list[str], rows: list[dict], averages: list[dict],
                       run_ids: dict[tuple[str, str], str]) -> str | None:
    """At the end of a sweep of several methods: each unit's run (`run_ids[(method, dataset)]`)
    tagged with its row of `rows` (the comparison's per dataset x method), each method's row of
    `averages` a run of its own with its table/* metrics (of the columns `titles`: the units'
    own, view.table_titles), and the experiment the comparison's saved view; returns the view's
    key (None where the results view is not saved either: view.publish_table says why)."""
    client = records.store.client
    for row in rows:
        run_id = run_ids.get((row["method"], row["dataset"]))
        if run_id:  # a failed unit too: the view shows it without numbers
            client.set_tag(run_id, COMPARISON_ROW_TAG, row["dataset"])
    for row in averages:
        if "seeds" in row:  # a method without an average (none finished) has no run
            _publish_average(records, state, parent_run_id, plan.name, row, titles)
    if "'" in plan.name or not view_format_known():
        return None
    shown = columns([COMPARISON_ROW_TAG, METHOD_TAG],
                    [f"{TABLE_PREFIX}{t}" for t in [*titles, VAL]], searched_keys(plan))
    return save_view(client, records.experiment_id(), comparison_key(plan.name),
                     f"{plan.name}: method comparison",
                     view_state(comparison_filter(plan.name), shown))


def _publish_average(records: SweepRecords, state, parent_run_id: str, sweep: str, row: dict,
                     titles: list[str]) -> None:
    """A method's average row as its run: its table/* metrics (rounded as the report shows
    them), the row tags, finished."""
    tracker = records.start_average_run(state, row["method"], sweep, parent_run_id)
    label = average_label(row["datasets"])
    log_once(tracker.client, tracker.run_id, table_metrics(row, titles))
    tracker.set_tag(COMPARISON_ROW_TAG, label)
    tracker.set_tag(ROW_TAG, label)  # its row in the results view too
    tracker.finish()


def comparison_link(uri: str, experiment_id: str, sweep: str) -> str | None:
    """The UI route (after the server's address) of the sweep's comparison view; None when the
    sweep saved none (one method, not finished, or an MLflow whose view format is unknown)."""
    view = view_query(open_tracker(uri).client, experiment_id, comparison_key(sweep))
    return view_link(experiment_id, view) if view else None
