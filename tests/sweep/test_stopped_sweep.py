"""`vacsr best` on a sweep a stop left unfinished, from records made as its driver leaves them (a
SIGKILL leaves its runs RUNNING, a SIGTERM closes them KILLED): the unfinished units and how the
sweep continues come first, no best method is named from the units that finished, a stopped unit
is never called failed, and a unit that failed still is."""
from __future__ import annotations

import pytest

from sweeps.base2novel import SWEEP as BASE2NOVEL

pytestmark = pytest.mark.timeout(120)

METHODS = ("vacsr", "sigmoid_baseline", "zero_shot", "linear_probe", "clip_adapter", "coop")
WHY_FAILED = "none of 2 trial(s) reported val/acc (2 failed)"


def _finish_unit(records, run_id: str, folder) -> None:
    """A unit as its Ray task ends it: its per-seed results, best val, trials and config."""
    from vacsr.records.artifacts import BEST_CONFIG, FINAL_RUNS

    run = records.continue_run(run_id)
    run.log_best({"val/acc": 61.0, "num_trials": 1})
    run.log_json(FINAL_RUNS, {"per_seed": [{"seed": 1, "acc": 70.0, "novel_acc": 60.0}]})
    (folder / BEST_CONFIG).write_text("adapter:\n  kind: zero_shot\n")
    run.log_artifact(folder / BEST_CONFIG)
    run.finish()


# `--methods all --datasets eurosat` stopped at its first finished unit (zero_shot's):
# linear_probe failed before it, vacsr and coop were searching, the other two had not started
STOPPED = {"vacsr": "left", "zero_shot": "FINISHED", "linear_probe": "FAILED", "coop": "left"}


def _sweep(tmp_path, units: dict[str, str], left: str) -> str:
    """A base-to-novel sweep of every method on eurosat whose units' runs ended as `units` says
    (method -> FINISHED, FAILED, or "left": `left` as the sweep's own run, RUNNING after a
    SIGKILL, KILLED after a SIGTERM's clean-up, FINISHED or FAILED at the sweep's end); a method
    not in `units` has no run. Returns the store's URI."""
    from vacsr.records.artifacts import COMPARISON_INFO, SWEEP_INFO
    from vacsr.records.sweep_records import SweepRecords
    from vacsr.records.sweep_state import SweepState
    from vacsr.results import table_spec

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    records = SweepRecords(uri, BASE2NOVEL.experiment)
    state = SweepState(tmp_path / "sweep_state.json", fresh=True)
    parent = records.start_sweep_run(state, "b2n", "base2novel", METHODS)
    budget = {"trials": 2, "seeds": [1, 2], "epochs": "2", "shots": 16, "selection": "val/acc"}
    parent.log_json(COMPARISON_INFO, {
        "spec": table_spec(BASE2NOVEL.table), "methods": list(METHODS),
        "budget": {m: {**budget, "seeds": [1] if m == "zero_shot" else [1, 2]} for m in METHODS},
        "units": {f"eurosat.{m}": {"method": m, "dataset": "eurosat"} for m in METHODS}})
    parent.log_json(SWEEP_INFO, {"kind": "base2novel", "metric": "val/acc",
                                 "table": table_spec(BASE2NOVEL.table)})
    for method, ended in units.items():
        run_id = records.start_dataset_run(state, f"eurosat.{method}", "b2n", parent.run_id,
                                           method)
        if ended == "FINISHED":
            _finish_unit(records, run_id, tmp_path)
        elif ended == "FAILED":
            records.note_failure(run_id, WHY_FAILED)
            records.close_dataset_run(run_id, "FAILED")
        elif left != "RUNNING":  # the stop's clean-up (run_sweep): each unfinished unit's run
            records.close_dataset_run(run_id, left)
    if left != "RUNNING":
        parent.finish(left)
    return uri


def _best(argv, capsys) -> tuple[int, str]:
    from vacsr.cli import main

    code = main(["best", "--experiment", BASE2NOVEL.experiment, *argv])
    captured = capsys.readouterr()
    assert captured.err == "", captured.err
    return code, captured.out


@pytest.mark.parametrize("left, why, resume", [
    ("RUNNING", "its driver is running, or was killed", "if its driver is gone, continue it"),
    ("KILLED", "stopped", "continue it")])
def test_an_unfinished_sweeps_comparison_says_so_first_and_names_no_best(tmp_path, capsys, left,
                                                                          why, resume):
    uri = _sweep(tmp_path, STOPPED, left)
    code, out = _best(["--tracking-uri", uri, "--compare"], capsys)
    assert code == 0, out  # what the store holds is what was asked for: not an error
    lines = out.splitlines()
    assert lines[:5] == [
        "sweep b2n is unfinished: 4 of its 6 units have not finished",
        f"  run {left} ({why}): eurosat.vacsr, eurosat.coop",
        "  not started: eurosat.sigmoid_baseline, eurosat.clip_adapter",
        f"{resume}: sweeps/base2novel.py --name b2n --resume, with the other flags it started "
        "with",
        ""], out
    assert lines[5] == "# Method comparison", out
    # a stopped unit is unfinished, never FAILED; the unit that failed still is
    rows = {line.split(" | ")[1]: line for line in lines if line.startswith("| eurosat | ")}
    for method in ("vacsr", "coop"):
        assert rows[method].startswith(f"| eurosat | {method} | unfinished (run {left}) |"), out
    for method in ("sigmoid_baseline", "clip_adapter"):
        assert rows[method].startswith(f"| eurosat | {method} | unfinished (not started) |")
    assert rows["linear_probe"].startswith(f"| eurosat | linear_probe | FAILED: {WHY_FAILED} |")
    assert rows["zero_shot"].startswith("| eurosat | zero_shot | 70.00 | 60.00 | 64.62 |"), out
    assert [line for line in lines if "FAILED" in line] == [rows["linear_probe"]], out
    assert "failed on every" not in out and "**" not in out, out
    # no best method, no difference, from the one unit that finished
    best = lines[lines.index("## Best method by H") + 2:lines.index("## Differences in H") - 1]
    assert best == ["- eurosat: none: the sweep is unfinished",
                    "- average: none: the sweep is unfinished"], out
    differences = [line for line in lines if line.startswith("- vacsr's H minus")]
    assert len(differences) == 2 and all(
        line.endswith(": not available (the sweep is unfinished).") for line in differences), out


def test_best_and_its_table_say_so_first_too(tmp_path, capsys):
    """`vacsr best` and `--table` on the same stopped sweep: the same lines first, the finished
    unit's selection as before, and no stopped unit called FAILED in the table."""
    uri = _sweep(tmp_path, STOPPED, "KILLED")
    notice = ["sweep b2n is unfinished: 4 of its 6 units have not finished",
              "  run KILLED (stopped): eurosat.vacsr, eurosat.coop",
              "  not started: eurosat.sigmoid_baseline, eurosat.clip_adapter",
              "continue it: sweeps/base2novel.py --name b2n --resume, with the other flags it "
              "started with", ""]
    code, out = _best(["--tracking-uri", uri], capsys)
    assert code == 0 and out.splitlines()[:5] == notice, out
    assert "eurosat.zero_shot  [FINISHED]" in out and "eurosat.vacsr  [KILLED]" in out, out
    code, out = _best(["--tracking-uri", uri, "--table"], capsys)
    assert code == 0 and out.splitlines()[:5] == notice, out
    assert [line for line in out.splitlines() if "FAILED" in line] == [
        f"| eurosat.linear_probe | FAILED: {WHY_FAILED} | | | | |"], out


def test_a_sweep_that_ended_with_a_failed_unit_has_no_notice(tmp_path, capsys):
    """Every unit finished or failed and the sweep's run ended: the comparison alone, its best
    method named, the failed unit FAILED."""
    units = {m: "FAILED" if m == "linear_probe" else "FINISHED" for m in METHODS}
    uri = _sweep(tmp_path, units, "FAILED")
    code, out = _best(["--tracking-uri", uri, "--compare"], capsys)
    assert code == 0 and out.startswith("# Method comparison\n"), out
    assert f"| eurosat | linear_probe | FAILED: {WHY_FAILED} |" in out
    assert "- eurosat: " in out and "unfinished" not in out, out


def test_a_stopped_sweep_of_one_method_names_what_its_records_hold(tmp_path, capsys):
    """A sweep of one method lists no units in its records: its started datasets are named, and
    a stop between two datasets still reads as unfinished by the sweep's own run."""
    from vacsr.records.sweep_records import SweepRecords
    from vacsr.records.sweep_state import SweepState

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    records = SweepRecords(uri, BASE2NOVEL.experiment)
    state = SweepState(tmp_path / "sweep_state.json", fresh=True)
    parent = records.start_sweep_run(state, "base2novel", "base2novel")
    _finish_unit(records, records.start_dataset_run(state, "eurosat", "base2novel",
                                                    parent.run_id), tmp_path)
    dtd = records.start_dataset_run(state, "dtd", "base2novel", parent.run_id)
    code, out = _best(["--tracking-uri", uri], capsys)
    assert code == 0 and out.splitlines()[:4] == [
        "sweep base2novel is unfinished: 1 dataset(s) have not finished (one not started has no "
        "record to name)",
        "  run RUNNING (its driver is running, or was killed): dtd",
        "if its driver is gone, continue it: sweeps/base2novel.py --name base2novel --resume, "
        "with the other flags it started with", ""], out
    records.close_dataset_run(dtd, "FAILED")
    parent.finish("KILLED")  # stopped as its next dataset would start
    code, out = _best(["--tracking-uri", uri], capsys)
    assert code == 0 and out.splitlines()[:3] == [
        "sweep base2novel is unfinished: its run is KILLED (stopped)",
        "continue it: sweeps/base2novel.py --name base2novel --resume, with the other flags it "
        "started with", ""], out
