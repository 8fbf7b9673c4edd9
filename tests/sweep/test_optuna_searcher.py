"""Why vacsr keeps its own Tune searcher over Optuna instead of Ray's `OptunaSearch`.

Ray's `OptunaSearch` (2.57 on) takes `storage=`, `study_name=` and `points_to_evaluate=`, but a
stopped driver leaves its running Optuna trials FAIL (Optuna refuses to update a finished trial),
and Ray's searcher, restored on `--resume`, reports the continued trial to that finished trial:
the report raises and the final value never reaches the study. The resumed search then samples
from a study that lacks the trial, so it draws other configs than an uninterrupted run would.
`OptunaStudySearch` reopens such a trial (tests/sweep/test_sweep_space.py,
test_a_trial_failed_by_a_stopped_driver_reports_to_a_fresh_optuna_trial_on_resume). If a Ray
release stops losing the value, this test fails (it runs on the newest Ray that `make test`
installs): then Ray's searcher is worth another look.
"""
from __future__ import annotations

import optuna
import pytest

from vacsr.sweep.search.tune import fail_running_trials


def _space(trial: optuna.Trial) -> None:
    trial.suggest_float("loss.beta", 0.1, 10.0, log=True)


def test_rays_optuna_search_loses_a_trial_continued_after_a_stop(tmp_path):
    from ray.tune.search.optuna import OptunaSearch

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    search = OptunaSearch(space=_space, metric="val/acc", mode="max", storage=storage,
                          study_name="s", seed=0, points_to_evaluate=[{"loss.beta": 1.0}])
    assert search.suggest("t1") == {"loss.beta": 1.0}
    search.on_trial_result("t1", {"val/acc": 4.0, "training_iteration": 1})
    search.save(str(tmp_path / "searcher.pkl"))
    assert fail_running_trials(storage, "s") == 1  # the driver stops

    resumed = OptunaSearch(space=_space, metric="val/acc", mode="max", storage=storage,
                           study_name="s", seed=0)
    resumed.restore(str(tmp_path / "searcher.pkl"))
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        resumed.on_trial_result("t1", {"val/acc": 5.0, "training_iteration": 2})
    resumed.on_trial_complete("t1", {"val/acc": 7.0, "training_iteration": 3})  # only a warning
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert [(t.state.name, t.value) for t in trials] == [("FAIL", None)]  # 7.0 is lost
    assert trials[0].user_attrs == {}  # nor does it record which Tune trial it configured
