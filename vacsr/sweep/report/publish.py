"""The sweep's end: its report on disk and on the sweep's MLflow run, the table's metrics on the
datasets' runs and the saved views (vacsr/records/view.py; a sweep of several methods also its
comparison's, vacsr/records/comparison_view.py)."""
from __future__ import annotations

from vacsr.records import MlflowTracker
from vacsr.records.comparison_view import publish_comparison
from vacsr.records.sweep_records import SweepRecords
from vacsr.records.sweep_state import SweepState
from vacsr.records.view import publish_table, table_titles
from vacsr.results import table_spec
from vacsr.sweep.plan.folders import report_folder
from vacsr.sweep.plan.plan import SweepPlan
from vacsr.sweep.report.comparison_shape import read_shape
from vacsr.sweep.report.importance import importance_section
from vacsr.sweep.report.methods_report import write_method_reports
from vacsr.sweep.report.table import write_report


def publish_sweep(plan: SweepPlan, state: SweepState, parent: MlflowTracker,
                  failed: dict[str, str]) -> tuple[list[dict], str]:
    """The sweep's end: its report on disk and on its run (parent), the table's metrics and the
    saved views in MLflow (a sweep of several methods: the comparison too); returns the table's
    rows and the console text."""
    results, folder = state.finished(plan.datasets), report_folder(plan.storage)
    compared = None
    # a rehearsal's reports, and its console text, open with what it is
    preface = f"{rehearsal_header(plan.rehearse)}\n\n" if plan.rehearse else ""
    if len(plan.methods) > 1:  # each method's table and their comparison
        rows, paths, text, compared = write_method_reports(plan, results, failed, folder,
                                                           preface)
    else:
        rows, paths, text = write_report(plan.kind, results, failed, folder,
                                         sections=importance_section(results, plan.kind.metric),
                                         preface=preface)
    for path in paths:  # each method's tables under methods/<method>/, as on disk
        where = path.parent.relative_to(folder).as_posix()
        parent.log_artifact(path, None if where == "." else where)
    run_ids = {d: state.dataset(d).get("run_id") for d in plan.datasets}
    publish_table(parent, plan, rows, run_ids)
    if compared is not None:
        unit_rows, averages = view_rows(plan, compared)
        publish_comparison(
            SweepRecords(plan.tracking_uri, plan.kind.experiment), state, parent.run_id, plan,
            table_titles(plan.kind, rows), unit_rows, averages,
            {(plan.method_of(u), plan.dataset_of(u)): i for u, i in run_ids.items() if i})
    return rows, text


def rehearsal_header(scale: float) -> str:
    return (f"**Rehearsal** (--rehearse {scale:g}): no run trained; each waited the cost "
            f"model's seconds / {scale:g} and reported a synthetic curve. These numbers are not "
            "results.")


def view_rows(plan: SweepPlan, compared: list[dict]) -> tuple[list[dict], list[dict]]:
    """The comparison's rows as its MLflow view shows them, a run each: (per dataset x method,
    each method's average). A comparison by target (domain generalisation: one trained dataset
    evaluated on several test sets) is a row per unit's run with the targets as its columns, the
    shifted average among them (the table's ood_avg_acc), so no run holds an average."""
    shape = read_shape(table_spec(plan.kind.table))
    if shape.unit == "dataset":
        return ([r for r in compared if r["dataset"] != shape.average],
                [r for r in compared if r["dataset"] == shape.average])
    return [{"dataset": plan.dataset_of(u), "method": plan.method_of(u)}
            for u in plan.datasets], []
