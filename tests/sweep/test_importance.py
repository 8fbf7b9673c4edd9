"""Appendix E's sensitivity analysis per dataset, from a real Optuna study (RDB storage) and a real
MLflow store: the artifacts name every searched key, the key that decides the metric ranks first,
a short search says it is not estimated, and `vacsr best --importance` prints it from MLflow."""
from __future__ import annotations

import json
import math

import pytest

from conftest import built_plan, one_line
from vacsr.sweep.report.importance import (
    MIN_FINISHED_TRIALS,
    analyse_study,
    importance_section,
    importance_table,
    top_keys_text,
)
from vacsr.sweep.spec.space import Choice, Int, LogFloat, suggest

pytestmark = pytest.mark.timeout(120)

SPACE = {"loss.gamma": LogFloat(0.1, 10.0), "optim.lr": LogFloat(1e-3, 3e-3),
         "adapter.num_components": Choice((1, 2, 3, 4)),
         "loss.neg_sigma_target": Choice(("label", "positive")), "train.epochs": Int(4, 8)}


def _objective(space):
    """val/acc decided by gamma alone (best at 1, as in appendix E.1); the other keys are searched
    but do not matter. Every trial reports per epoch; odd trials stop after 2 (as ASHA would)."""
    def objective(trial):
        values = suggest(trial, space)
        value = 70.0 - 20.0 * abs(math.log10(values["loss.gamma"]))
        for epoch in range(1, (2 if trial.number % 2 else values["train.epochs"]) + 1):
            trial.report(value - 5.0 / epoch, epoch)
        return value
    return objective


def _study(n_trials: int, space=SPACE, storage=None, name="s"):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", storage=storage, study_name=name,
                                sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(_objective(space), n_trials=n_trials)
    return study


def test_importance_ranks_the_deciding_key_first_and_marks_stopped_and_selected_trials():
    study = _study(MIN_FINISHED_TRIALS + 4)
    best = study.best_trial.params
    result = analyse_study(study, "eurosat", SPACE, metric="val/acc", mode="max",
                           planned_epochs=8, selected=best)
    assert result.message is None and set(result.importance) == set(SPACE)
    assert sum(result.importance.values()) == pytest.approx(1.0)
    assert result.top(1)[0][0] == "loss.gamma", result.importance
    assert result.importance["loss.gamma"] > 0.5, result.importance
    assert len(result.trials) == MIN_FINISHED_TRIALS + 4
    assert [p["stopped_early"] for p in result.trials] == [n % 2 == 1 for n in range(24)]
    assert [p["number"] for p in result.trials if p["selected"]] == [study.best_trial.number]


def test_a_conditional_key_neither_shrinks_the_estimate_nor_unmarks_the_selected_trial():
    """A key drawn in some trials only (its condition) gets no share, and the keys drawn in
    every trial are estimated over every trial, as without it (Optuna keeps only the trials
    holding every key asked for). The selected trial is marked though it did not draw it."""
    conditional = {**SPACE, "loss.beta": LogFloat(0.1, 10.0, when=("adapter.num_components", 1))}
    mixed = _study(MIN_FINISHED_TRIALS + 4, conditional)
    drew = [t for t in mixed.trials if "loss.beta" in t.params]
    assert 0 < len(drew) < len(mixed.trials)  # some trials drew it, not all
    chosen = next(t for t in mixed.trials if "loss.beta" not in t.params)
    selected = {**chosen.params, "loss.beta": 1.0}  # as the chosen config holds every key
    result = analyse_study(mixed, "eurosat", conditional, metric="val/acc", mode="max",
                           planned_epochs=8, selected=selected)
    assert set(result.importance) == set(SPACE)  # not loss.beta
    assert result.top(1)[0][0] == "loss.gamma", result.importance
    assert all(("loss.beta" in t.params) == (t.params["adapter.num_components"] == 1)
               for t in mixed.trials)
    assert [p["number"] for p in result.trials if p["selected"]] == [chosen.number]


def test_below_the_minimum_it_says_so_instead_of_ranking_noise():
    result = analyse_study(_study(MIN_FINISHED_TRIALS - 1), "dtd", SPACE, metric="val/acc",
                           mode="max", planned_epochs=8)
    assert result.importance is None and result.top() == []
    assert f"fewer than the {MIN_FINISHED_TRIALS}" in result.message
    section = importance_section({"dtd": {"importance": result.summary()}}, "val/acc")
    assert f"| dtd | {MIN_FINISHED_TRIALS - 1} | not estimated (fewer than " \
           f"{MIN_FINISHED_TRIALS}) | |" in section


def test_best_importance_says_not_estimated_once():
    """`vacsr best --importance` on a short search: one line naming each dataset's count, not a
    grid of blanks with the same sentence per dataset; beside an estimate, only the estimate's
    columns and that line."""
    short = [analyse_study(_study(n), name, SPACE, metric="val/acc", mode="max",
                           planned_epochs=8) for name, n in (("dtd", 2), ("eurosat", 3))]
    assert importance_table(short) == (
        f"importance for val/acc: not estimated: dtd 2, eurosat 3 of the {MIN_FINISHED_TRIALS} "
        "finished trials an estimate needs\n")
    full = analyse_study(_study(MIN_FINISHED_TRIALS), "ucf101", SPACE, metric="val/acc",
                         mode="max", planned_epochs=8)
    lines = importance_table([short[0], full]).splitlines()
    assert lines[2] == "| key | ucf101 |" and lines[-1].startswith("not estimated: dtd 2 of")
    assert sum("not estimated" in line for line in lines) == 1
    assert top_keys_text(short[0].summary()) == \
        f"2 trials finished; an importance estimate needs {MIN_FINISHED_TRIALS}"


def _plan(tmp_path):
    """A plan as the driver holds it, built directly (the CLI's plan costs seconds of imports):
    the base-to-novel kind and eurosat's real search space."""
    from sweeps.base2novel import SWEEP
    from vacsr.config import Config
    from vacsr.sweep.spec.space import dataset_space

    space = dataset_space(dict(SWEEP.space), SWEEP.batch_sizes["eurosat"])
    return built_plan(SWEEP, tmp_path, name="base2novel", configs={"eurosat": Config()},
                      spaces={"eurosat": space}, storage=tmp_path / "sweeps")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_dataset_run_holds_the_table_and_figure_and_best_prints_them(tmp_path, capsys):
    """Also `vacsr best`: values rounded for reading, the exported YAML at full precision."""
    from PIL import Image

    from vacsr.cli import main
    from vacsr.config import Config, load_config, save_config
    from vacsr.records import MlflowTracker
    from vacsr.sweep.report.importance import record_sensitivity

    plan = _plan(tmp_path)
    plan.storage.mkdir(parents=True)  # as run_sweep does
    space = plan.spaces["eurosat"]
    assert "loss.gamma" in space  # the objective's key
    import optuna

    study = optuna.create_study(direction="maximize", storage=plan.optuna_storage_url,
                                study_name=f"{plan.name}-eurosat")
    study.add_trials(_study(MIN_FINISHED_TRIALS, space).trials)  # one write per trial
    parent = MlflowTracker(plan.tracking_uri)
    parent_id = parent.start(plan.kind.experiment, plan.name,
                             tags={"vacsr.sweep": plan.name, "vacsr.kind": plan.kind.name})
    run = MlflowTracker(plan.tracking_uri)
    run_id = run.start(plan.kind.experiment, "eurosat", parent_run_id=parent_id,
                       tags={"vacsr.dataset": "eurosat", "vacsr.sweep": plan.name})
    summary = record_sensitivity(plan, "eurosat", run, study.best_trial.params)
    best = Config()
    best.loss.alpha_kl = 0.0007891721226571268
    run.log_params({"loss.alpha_kl": best.loss.alpha_kl, "adapter.num_components": 3,
                    "loss.neg_sigma_target": "positive"})
    run.log_best({"val/acc": 71.23456})
    run.log_values({"table/base": 70.0, "table/novel": 60.0, "table/H": 64.6154,
                    "table/H_std": 0.5, "table/val": 71.23})  # as the sweep's end publishes them
    save_config(best, tmp_path / "best_config.yaml")
    run.log_artifact(tmp_path / "best_config.yaml")
    run.finish()
    parent.finish()

    assert summary["top"][0][0] == "loss.gamma"
    folder = plan.storage / "report" / "importance" / "eurosat"
    written = json.loads((folder / "importance.json").read_text())
    assert set(written["importance"]) == set(space) == set(written["keys"])
    assert Image.open(folder / "importance.png").size[0] > 400
    client = run.client
    assert {a.path for a in client.list_artifacts(run_id, "importance")} == {
        "importance/importance.json", "importance/importance.png"}
    metrics = client.get_run(run_id).data.metrics
    assert {f"importance/{k}" for k in space} <= set(metrics)
    assert client.get_run(run_id).data.tags["vacsr.top_keys"].startswith("loss.gamma (")

    assert main(["best", "--importance", "--tracking-uri", plan.tracking_uri]) == 0
    out = capsys.readouterr().out
    assert "| key | eurosat |" in out
    for key in space:
        assert f"| {key} | " in out, out
    assert f"| *finished trials* | {MIN_FINISHED_TRIALS} |" in out

    assert main(["best", "--tracking-uri", plan.tracking_uri, "--export", str(tmp_path / "x")]) == 0
    out = capsys.readouterr().out
    assert "config:  adapter.num_components=3, loss.alpha_kl=0.0007892, " \
           "loss.neg_sigma_target=positive" in out, out
    # in the table's words, H included, each number once
    assert "metrics: base=70.00, novel=60.00, H=64.62, val/acc=71.23" in out, out
    assert "test_acc" not in out

    line = one_line(["best", "--compare", "--tracking-uri", plan.tracking_uri], capsys)
    assert line == (f"vacsr: error: sweep {plan.name!r} ran one method (vacsr): there is "
                    "nothing to compare (a sweep run with --methods a,b has a comparison)"), line
    line = one_line(["best", "--compare", "--table", "--tracking-uri", plan.tracking_uri], capsys)
    assert "--table: not allowed with argument --compare" in line, line
    line = one_line(["best", "--experiment", "vacsr-retrieval", "--tracking-uri",
                     plan.tracking_uri], capsys)
    assert line.startswith("vacsr: error: MLflow experiment 'vacsr-retrieval' not found in ") \
        and line.endswith("(it holds: vacsr-base2novel)"), line
    assert load_config(tmp_path / "x" / "eurosat.yaml").loss.alpha_kl == 0.0007891721226571268
