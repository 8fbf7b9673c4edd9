"""The sweep's view in the MLflow UI: its runs table with the final table's metrics as columns.

The runs page of MLflow 3.17 and 3.18 reads its search facets from the URL (`searchFilter`,
`orderByKey`, `orderByAsc`, `startTime`, `lifecycleFilter`, `modelVersionFilter`, `datasetsFilter`)
but not its columns: those come from the browser's local storage or from a *saved view* ("Save
view" on the runs page, listed under "Views"), which the UI keeps as an experiment tag
`mlflow.sharedViewState.<id>` and opens from `#/experiments/<id>/runs?viewStateShareKey=<id>`.
The sweep saves such a view at its end, in the form the UI writes (a JSON envelope with name,
times and the state as a JSON string): filtered on the sweep, every run shown, and as columns:
the run's row of the table (tag ROW_TAG: a dataset, or the average the sweep's own run holds),
the table's metrics (`table/<column>` and the best val `table/val`, rounded as results.md shows
them; their spread over seeds, `table/<column>_std`, is logged with 2+ seeds), the searched keys
of each chosen config (the dataset runs' params) and Dataset. The link carries only the view
key: the UI ignores a saved view when the URL also sets a search facet.

That tag is the UI's own format, not an API: the view is saved only on the MLflow releases whose
UI was checked to read it (VIEW_FORMAT_MLFLOW; tests/e2e/test_mlflow_ui.py renders it). On another
release the sweep says so in one line, and its link opens the sweep's runs filtered and sorted.
A sweep of several methods saves a second view, its method comparison (comparison_view.py), in
the same form.
"""
from __future__ import annotations

import json
import math
import re
import sys
import time
from urllib.parse import quote, urlencode

from vacsr.records.sweep_records import SWEEP_TAG
from vacsr.records.tracker import open_tracker
from vacsr.results import DIGITS, VAL, table_spec

VIEW_TAG_PREFIX = "mlflow.sharedViewState."
VIEW_PARAM = "viewStateShareKey"
TABLE_PREFIX = "table/"
ROW_TAG = "vacsr.table_row"  # the table row a run holds: its dataset, or "average (N datasets)"
# the MLflow releases (major.minor) whose UI reads the view as view_state writes it: add one
# once tests/e2e/test_mlflow_ui.py passes on it
VIEW_FORMAT_MLFLOW = ("3.17", "3.18")


def mlflow_release() -> str:
    """The installed MLflow's major.minor ("3.17")."""
    import mlflow

    return ".".join(mlflow.__version__.split(".")[:2])


def view_format_known() -> bool:
    return mlflow_release() in VIEW_FORMAT_MLFLOW


def view_key(sweep: str, prefix: str = "vacsr-") -> str:
    """The saved view's key: `prefix` and the sweep's name in the characters a key takes."""
    return prefix + re.sub(r"[^\w\-]", "-", sweep)


def sweep_filter(sweep: str) -> str:
    """The runs search that finds the sweep's runs (not its trials' and seeds')."""
    return f"tags.`{SWEEP_TAG}` = '{sweep}'"


def average_label(datasets: int) -> str:
    """The table row (ROW_TAG) of an average over `datasets` datasets."""
    return f"average ({datasets} datasets)"


def table_metrics(row: dict, titles: list[str]) -> dict[str, float]:
    """A table row (table_rows, vacsr/sweep/report/table.py) as the metrics the view shows,
    rounded as the table shows them: table/<column>, its spread over seeds (with 2+ seeds),
    table/val (dataset rows)."""
    metrics = {}
    for title in titles:
        if title in row:
            metrics[f"{TABLE_PREFIX}{title}"] = round(row[title], DIGITS)
            if row.get("seeds", 1) > 1:
                metrics[f"{TABLE_PREFIX}{title}_std"] = round(row.get(f"{title}_std", 0.0), DIGITS)
    if isinstance(row.get(VAL), float) and math.isfinite(row[VAL]):
        metrics[f"{TABLE_PREFIX}{VAL}"] = round(row[VAL], DIGITS)
    return metrics


def table_titles(kind, rows: list[dict]) -> list[str]:
    """The table's column titles (H included), or every result column of a kind that names none."""
    spec = table_spec(kind.table)
    titles = [c[0] for c in spec["columns"]] + (["H"] if spec["harmonic"] else [])
    if titles:
        return titles
    first = next((r for r in rows if "failed" not in r), {})
    return [k for k in first if k not in ("dataset", "seeds", VAL) and not k.endswith("_std")]


def columns(tags: list[str] = (), metrics: list[str] = (), params: list[str] = (),
            dataset: bool = False) -> list[str]:
    """Column ids as the UI names them (`tags.`<key>``, `metrics.`<key>``, `params.`<key>``),
    in this order, the Dataset column (the widest) last."""
    return [*(f"tags.`{t}`" for t in tags), *(f"metrics.`{m}`" for m in metrics),
            *(f"params.`{p}`" for p in params), *(["attributes.`Dataset`"] if dataset else [])]


def view_state(search_filter: str, shown: list[str]) -> dict:
    """A saved view's state: the UI merges it over its defaults, so only what differs. The runs
    `search_filter` finds, sorted by name, with the `shown` columns right of the run names, where
    the first of them show without scrolling."""
    return {"searchFilter": search_filter,
            "orderByKey": "tags.`mlflow.runName`", "orderByAsc": True,
            "selectedColumns": shown, "columnOrder": ["attributes.`Run Name`", *shown],
            # the chart view: every row's bars (its default shows the first 10 runs), and the
            # table's metrics only
            "runsHiddenMode": "SHOW_ALL", "chartsSearchFilter": TABLE_PREFIX}


def save_view(client, experiment_id: str, key: str, name: str, state: dict) -> str:
    """Write (or replace) the saved view `key` named `name`; returns its key."""
    now = int(time.time() * 1000)
    envelope = {"name": name, "createdAt": now, "updatedAt": now, "state": json.dumps(state)}
    client.set_experiment_tag(experiment_id, VIEW_TAG_PREFIX + key, json.dumps(envelope))
    return key


def searched_keys(plan) -> list[str]:
    """Every searched key of the sweep's units, once, in order: the chosen configs' columns."""
    return list(dict.fromkeys(k for d in plan.datasets for k in plan.spaces.get(d, {})))


def publish_table(tracker, plan, rows: list[dict], run_ids: dict[str, str]) -> str | None:
    """At the sweep's end: each dataset run gets its table row as table/* metrics, the sweep's run
    the average row, and the experiment the saved view; returns the view's key."""
    titles = table_titles(plan.kind, rows)
    finished = [r for r in rows if "failed" not in r and r["dataset"] != "average"]
    for row in rows:
        if "failed" in row:
            continue
        average = row["dataset"] == "average"
        run_id = tracker.run_id if average else run_ids.get(row["dataset"])
        if run_id:
            log_once(tracker.client, run_id, table_metrics(row, titles))
            tracker.client.set_tag(run_id, ROW_TAG, average_label(len(finished))
                                   if average else row["dataset"])
    if "'" in plan.name:  # it would end the view's filter string early
        return None
    if not view_format_known():
        print(f"vacsr: note: MLflow {mlflow_release()} is not a release whose saved-view format "
              f"vacsr knows ({', '.join(VIEW_FORMAT_MLFLOW)}): the sweep's view is not saved, "
              "its link opens the sweep's runs filtered", file=sys.stderr, flush=True)
        return None
    shown = columns([ROW_TAG], [f"{TABLE_PREFIX}{t}" for t in [*titles, VAL]],
                    searched_keys(plan), dataset=True)
    return save_view(tracker.client, tracker.experiment_id(plan.kind.experiment),
                     view_key(plan.name), f"{plan.name}: results",
                     view_state(sweep_filter(plan.name), shown))


def log_once(client, run_id: str, values: dict[str, float]) -> None:
    """Log the values the run does not hold yet (a resumed sweep writes what one run writes)."""
    from mlflow.entities import Metric

    held, now = client.get_run(run_id).data.metrics, int(time.time() * 1000)
    new = [Metric(k, float(v), now, 0) for k, v in values.items() if held.get(k) != float(v)]
    if new:
        client.log_batch(run_id, metrics=new)


def view_query(client, experiment_id: str, key: str) -> dict[str, str] | None:
    """The link's query for the saved view `key`; None when the experiment holds none, or the
    installed MLflow's UI may not read it."""
    if not view_format_known():
        return None
    tags = client.get_experiment(experiment_id).tags
    return {VIEW_PARAM: key} if VIEW_TAG_PREFIX + key in tags else None


def view_link(experiment_id: str, query: dict[str, str]) -> str:
    """The UI route (after the server's address) of the experiment's runs table with `query`.
    MLflow 3.17's UI opens every experiment on its GenAI overview (traces) whatever the
    experiment's kind tag says, so the link asks for the runs table (`workflowType`); the /runs
    route: `#/experiments/<id>` redirects there and drops the query on the way."""
    query = {"workflowType": "machine_learning", **query}
    return f"/#/experiments/{experiment_id}/runs?{urlencode(query, quote_via=quote)}"


def runs_link(uri: str, experiment_id: str, sweep: str | None) -> str:
    """The UI route (after the server's address) of the experiment's runs table: the sweep's
    saved view when it has one, else its runs filtered and sorted by name (sorted by start time
    the table would fold the dataset runs under the sweep's run)."""
    view = (view_query(open_tracker(uri).client, experiment_id, view_key(sweep)) if sweep
            else None)
    query = {}
    if view:
        query = view  # alone: a search facet in the URL would override the view
    elif sweep and "'" not in sweep:  # a quote would end the filter's string early
        query = {"searchFilter": sweep_filter(sweep), "orderByKey": "tags.`mlflow.runName`",
                 "orderByAsc": "true"}
    return view_link(experiment_id, query)
