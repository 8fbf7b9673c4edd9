"""The sweep's view in the MLflow UI: its runs table with the final table's metrics as columns.

MLflow 3.17's runs page reads its search facets from the URL (`searchFilter`, `orderByKey`,
`orderByAsc`, `startTime`, `lifecycleFilter`, `modelVersionFilter`, `datasetsFilter`) but not its
columns: those come from the browser's local storage or from a *saved view* ("Save view" on the
runs page, listed under "Views"), which the UI keeps as an experiment tag
`mlflow.sharedViewState.<id>` and opens from `#/experiments/<id>/runs?viewStateShareKey=<id>`.
The sweep saves such a view at its end, in the form the UI writes (a JSON envelope with name,
times and the state as a JSON string): filtered on the sweep, every run shown, columns Dataset,
the table's metrics (`table/<column>`) and the selection metric, those first. The link carries
only the view key: the UI ignores a saved view when the URL also sets a search facet.
"""
from __future__ import annotations

import json
import re
import time

from vacsr.sweep.report.table import table_spec

VIEW_TAG_PREFIX = "mlflow.sharedViewState."
VIEW_PARAM = "viewStateShareKey"
TABLE_PREFIX = "table/"


def view_key(sweep: str) -> str:
    return "vacsr-" + re.sub(r"[^\w\-]", "-", sweep)


def table_metrics(row: dict, titles: list[str]) -> dict[str, float]:
    """A table row (report.table_rows) as the metrics the view shows: table/<column>, its std."""
    metrics = {}
    for title in titles:
        if title in row:
            metrics[f"{TABLE_PREFIX}{title}"] = row[title]
            metrics[f"{TABLE_PREFIX}{title}_std"] = row.get(f"{title}_std", 0.0)
    return metrics


def table_titles(kind, rows: list[dict]) -> list[str]:
    """The table's column titles (H included), or every result column of a kind that names none."""
    spec = table_spec(kind.table)
    titles = [c[0] for c in spec["columns"]] + (["H"] if spec["harmonic"] else [])
    if titles:
        return titles
    first = next((r for r in rows if "failed" not in r), {})
    return [k for k in first if k not in ("dataset", "seeds", "val") and not k.endswith("_std")]


def view_state(sweep: str, columns: list[str]) -> dict:
    """The saved view's state: the UI merges it over its defaults, so only what differs. Column
    ids are the UI's (`metrics.`<key>``); the order puts the metrics right of the run names, where
    they show without scrolling, and the Dataset column after them."""
    metrics = [f"metrics.`{c}`" for c in columns]
    dataset = "attributes.`Dataset`"
    return {"searchFilter": f"tags.`vacsr.sweep` = '{sweep}'",
            "orderByKey": "tags.`mlflow.runName`", "orderByAsc": True,
            "selectedColumns": [dataset, *metrics],
            "columnOrder": ["attributes.`Run Name`", *metrics, dataset],
            # the chart view: every dataset's bars (its default shows the first 10 runs), and
            # the table's metrics only
            "runsHiddenMode": "SHOW_ALL", "chartsSearchFilter": TABLE_PREFIX}


def save_view(client, experiment_id: str, sweep: str, columns: list[str]) -> str:
    """Write (or replace) the sweep's saved view; returns its key."""
    key = view_key(sweep)
    now = int(time.time() * 1000)
    envelope = {"name": f"{sweep}: results", "createdAt": now, "updatedAt": now,
                "state": json.dumps(view_state(sweep, columns))}
    client.set_experiment_tag(experiment_id, VIEW_TAG_PREFIX + key, json.dumps(envelope))
    return key


def publish_table(tracker, plan, rows: list[dict], run_ids: dict[str, str]) -> str | None:
    """At the sweep's end: each dataset run gets its table row as table/* metrics, the sweep's run
    the average row, and the experiment the saved view; returns the view's key."""
    titles = table_titles(plan.kind, rows)
    for row in rows:
        if "failed" in row:
            continue
        run_id = run_ids.get(row["dataset"]) if row["dataset"] != "average" else tracker.run_id
        if run_id:
            _log_once(tracker.client, run_id, table_metrics(row, titles))
    if "'" in plan.name:  # it would end the view's filter string early
        return None
    columns = [f"{TABLE_PREFIX}{t}" for t in titles] + [f"best_{plan.kind.metric}"]
    return save_view(tracker.client, tracker.experiment_id(plan.kind.experiment), plan.name,
                     columns)


def _log_once(client, run_id: str, values: dict[str, float]) -> None:
    """Log the values the run does not hold yet (a resumed sweep writes what one run writes)."""
    from mlflow.entities import Metric

    held, now = client.get_run(run_id).data.metrics, int(time.time() * 1000)
    new = [Metric(k, float(v), now, 0) for k, v in values.items() if held.get(k) != float(v)]
    if new:
        client.log_batch(run_id, metrics=new)


def view_query(client, experiment_id: str, sweep: str) -> dict[str, str] | None:
    """The link's query for the sweep's saved view, None when the sweep saved none."""
    key = view_key(sweep)
    tags = client.get_experiment(experiment_id).tags
    return {VIEW_PARAM: key} if VIEW_TAG_PREFIX + key in tags else None
