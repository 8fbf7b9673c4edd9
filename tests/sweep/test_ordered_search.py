"""Optuna's draws in creation order (vacsr/sweep/search/optuna_searcher.py): with N trials at once,
trial k's config depends on trials 0..k-N only, whatever order the trials end in, and across a
stop and --resume; the study holds the trials' values in creation order."""
from __future__ import annotations

import math
import random

import optuna
import pytest

from vacsr.sweep.plan.studies import fail_running_trials
from vacsr.sweep.search.optuna_searcher import CREATION_ATTR, OptunaStudySearch
from vacsr.sweep.spec.space import Choice, DefineByRun, LogFloat

pytestmark = pytest.mark.timeout(300)

TRIALS, AT_ONCE = 14, 3  # beyond TPE's 10 start-up trials: the last draws read the study
SPACE = DefineByRun({"loss.beta": LogFloat(0.1, 10.0), "adapter.K": Choice([1, 2, 3, 4])})


def _value(config: dict) -> float:
    """A trial's val: a function of its config, with ties."""
    return round(-abs(math.log(config["loss"]["beta"])) * 2) / 2 + config["adapter"]["K"] / 4


def _searcher(storage, **settings) -> OptunaStudySearch:
    search = OptunaStudySearch(SPACE, metric="val/acc", mode="max", storage=storage,
                               study_name="s-dtd", seed=4, num_samples=TRIALS,
                               points_to_evaluate=[{"loss.beta": 1.0, "adapter.K": 2}],
                               **settings)
    assert search.set_max_concurrency(AT_ONCE)  # as Tune sets max_concurrent_trials
    return search


class Search:
    """Tune's side: asks for a trial whenever fewer than N run (a None: asked again later, with
    a new id), and ends a random running trial with its value."""

    def __init__(self, search: OptunaStudySearch, rng: random.Random) -> None:
        self.search, self.rng = search, rng
        self.live: dict[str, dict] = {}  # trial id -> config
        self.configs: dict[int, dict] = {}  # creation index -> config
        self.asked = 0

    def step(self) -> bool:
        if len(self.configs) < TRIALS and len(self.live) < AT_ONCE and self.rng.random() < 0.6:
            self.asked += 1
            trial_id = f"a{self.asked}"
            config = self.search.suggest(trial_id)
            if config is not None:
                self.live[trial_id] = config
                self.configs[self.search.creation_index(trial_id)] = config
            return True
        if not self.live:
            return len(self.configs) < TRIALS
        trial_id = self.rng.choice(sorted(self.live))
        config = self.live.pop(trial_id)
        self.search.on_trial_result(trial_id, {"val/acc": _value(config) - 1,
                                               "training_iteration": 1})
        self.search.on_trial_complete(trial_id, {"val/acc": _value(config),
                                                 "training_iteration": 2})
        return True


def _study(storage) -> list[tuple]:
    """The study's told trials in number order: (creation index, params, value)."""
    study = optuna.load_study(study_name="s-dtd", storage=storage)
    return [(t.user_attrs[CREATION_ATTR], t.params, t.value) for t in study.trials
            if t.state.name == "COMPLETE"]


def _run(tmp_path, name: str, rng: random.Random, **settings) -> tuple[dict, list]:
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / name}")
    tuning = Search(_searcher(storage, **settings), rng)
    while tuning.step():
        pass
    return tuning.configs, _study(storage)


def test_the_draws_do_not_depend_on_the_order_trials_end_in(tmp_path):
    """Five searches whose trials end in different orders draw the same config for each creation
    index, and their studies hold the same values in the same (creation) order; a draw waits
    until trial k-N has been told."""
    first = _run(tmp_path, "0.db", random.Random(0))
    assert len(first[0]) == TRIALS and [i for i, _, _ in first[1]] == list(range(TRIALS))
    for seed in range(1, 5):
        assert _run(tmp_path, f"{seed}.db", random.Random(seed)) == first, seed


def test_a_draw_waits_for_trial_k_minus_n_once_tpe_reads_the_study(tmp_path):
    """Past TPE's random start-up (2 told trials here), trial k's draw waits until trials
    0..k-N are told; before it a draw reads nothing, and waits only while N trials run."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'o.db'}")
    search = _searcher(storage, startup_trials=2)
    for i in range(AT_ONCE):
        assert search.suggest(f"t{i}") is not None
    assert search.suggest("x") is None  # N running
    search.on_trial_complete("t2", {"val/acc": 1.0})  # ended, but trial 0 has not
    # trial 3's draw would see trial 0 alone, fewer than TPE's start-up: drawn at once
    assert search.suggest("t3") is not None and _study(storage) == []  # t2 waits, untold
    search.on_trial_complete("t3", {"val/acc": 0.2})
    assert search.suggest("x") is None  # trial 4's draw reads trials 0 and 1: not told yet
    search.on_trial_complete("t0", {"val/acc": 0.5})
    assert [i for i, _, _ in _study(storage)] == [0] and search.suggest("x") is None
    search.on_trial_complete("t1", {"val/acc": 0.7})
    assert [i for i, _, _ in _study(storage)] == [0, 1]  # t2 only after trial 4's draw
    assert search.suggest("t4") is not None
    assert [i for i, _, _ in _study(storage)] == [0, 1]


@pytest.mark.parametrize("startup", [2, 10])
def test_early_draws_are_the_draws_one_trial_at_a_time_gives(tmp_path, startup):
    """The draws made without waiting (TPE's random start-up) and those after it equal what a
    search of one trial at a time draws for each creation index, values told in the same
    order: starting a trial early changes no config."""
    at_once = _run(tmp_path, "n.db", random.Random(7), startup_trials=startup)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'one.db'}")
    search, configs = _searcher(storage, startup_trials=startup), {}
    for index in range(TRIALS):  # each trial ends before the next is asked for
        config = search.suggest(f"s{index}")
        configs[index] = config
        search.on_trial_complete(f"s{index}", {"val/acc": _value(config)})
    # the one-at-a-time search told each trial before the next draw: N = 1 sees 0..k-1, not
    # 0..k-N, so beyond the start-up it draws from more; up to it, both draw alone
    same = startup + AT_ONCE - 1  # the first index whose draw reads the study with N at once
    assert {i: c for i, c in at_once[0].items() if i < same} == \
        {i: c for i, c in configs.items() if i < same}


@pytest.mark.parametrize("startup", [2, 10])
def test_a_stopped_and_resumed_search_draws_what_an_uninterrupted_one_draws(tmp_path, startup):
    """The driver stops at a random point (running trials, and ended ones not told yet, are
    marked FAIL); the searcher is restored from its last save, taken a few steps earlier (Tune
    saves now and then), and the trials Tune had then go on; twelve stops (a lost draw was
    drawn again wrongly in the 7th and 10th). Each creation index gets the uninterrupted
    search's config, and the study's told trials come in creation order: with TPE reading the
    study from the third told trial on, and past Optuna's 10."""
    clean_configs, clean_study = _run(tmp_path, "clean.db", random.Random(0),
                                      startup_trials=startup)
    rng = random.Random(8)
    for attempt in range(12):
        storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / f'stop{attempt}.db'}")
        tuning = Search(_searcher(storage, startup_trials=startup), rng)
        saved, stop_at = None, rng.randint(5, 30)
        for step in range(stop_at):
            if step % 4 == 0:  # Tune's save: the searcher's state with the trials it knew
                tuning.search.save(str(tmp_path / "searcher.pkl"))
                saved = (dict(tuning.live), dict(tuning.configs))
            if not tuning.step():
                break
        fail_running_trials(storage, "s-dtd")
        live, configs = saved
        restored = _searcher(storage, startup_trials=startup)
        restored.restore(str(tmp_path / "searcher.pkl"))
        resumed = Search(restored, rng)
        resumed.live, resumed.configs, resumed.asked = live, configs, 1000 + attempt * 100
        while resumed.step():
            pass
        assert resumed.configs == clean_configs, attempt
        told = [(i, p, v) for i, p, v in _study(storage)]
        assert sorted(told) == sorted(clean_study)
        assert [i for i, _, _ in told] == sorted(i for i, _, _ in told), told


def test_a_trial_asha_stopped_is_told_its_value_at_the_stop(tmp_path):
    """A trial Tune restarted on --resume before its stop was decided reports an epoch past the
    rung; the study is told its value at the stop rung, as an uninterrupted search told it."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'o.db'}")
    search = _searcher(storage)
    for i in range(AT_ONCE):  # trial 0 is told once trial N-1 was drawn
        search.suggest(f"t{i}")
    search.note_stop("t0", 0.25)  # the rung's value, from the scheduler's ledger
    search.on_trial_complete("t0", {"val/acc": 0.75})  # the report an epoch later
    [(index, _, value)] = _study(storage)
    assert (index, value) == (0, 0.25)


def _resumed(tmp_path, storage, configs: dict, killed: bool = False, **settings) -> Search:
    """The stopped driver's trials marked FAIL (a SIGKILL leaves them RUNNING and WAITING: the
    resumed search marks them, vacsr/sweep/search/tune.py), the searcher restored from its save
    (trials 0..N-1 running then: Tune continues them), and the search run to its end."""
    if not killed:
        fail_running_trials(storage, "s-dtd")
    restored = _searcher(storage, **settings)
    restored.restore(str(tmp_path / "searcher.pkl"))
    resumed = Search(restored, random.Random(1))
    resumed.live = {f"t{i}": configs[i] for i in range(AT_ONCE)}
    resumed.configs = {i: configs[i] for i in range(AT_ONCE)}
    while resumed.step():
        pass
    return resumed


def test_a_trial_told_before_the_stop_but_lost_by_tune_is_repeated_not_told_again(tmp_path):
    """Tune's last save predates trial 3, which was drawn, ended and told before the stop: the
    resumed Tune asks for a trial in its place. It gets trial 3's config on trial 3's Optuna
    trial, the study holds each creation index once, as the uninterrupted search's does, and
    selection's creation order gives the repeat index 3."""
    from vacsr.sweep.search.selection import creation_order

    clean_configs, clean_study = _run(tmp_path, "clean.db", random.Random(0))
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'stop.db'}")
    search = _searcher(storage)
    configs = {i: search.suggest(f"t{i}") for i in range(AT_ONCE)}
    search.save(str(tmp_path / "searcher.pkl"))  # Tune's last save: trials 0..2 running
    ends = [("t0", None), ("t1", "t3"), ("t2", "t4"), ("t3", "t5"), ("t4", None)]
    for ended, drawn in ends:
        search.on_trial_complete(ended, {"val/acc": _value(configs[int(ended[1:])])})
        if drawn:
            configs[int(drawn[1:])] = search.suggest(drawn)
    assert 3 in [i for i, _, _ in _study(storage)]  # told before the stop
    assert _resumed(tmp_path, storage, configs).configs == clean_configs
    told = _study(storage)
    assert sorted(told) == sorted(clean_study)  # index 3 once, no second COMPLETE trial
    assert creation_order(storage, "s-dtd")["a1"] == 3  # the first trial Tune asks for


def _trial_3_drawn_after_the_last_save(tmp_path):
    """A search of start-up 2: trials 0..2 drawn, Tune's last save, trials 0 and 1 ended and
    trial 3 drawn. Returns the storage, the searcher and the configs by creation index."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'stop.db'}")
    search = _searcher(storage, startup_trials=2)
    configs = {i: search.suggest(f"t{i}") for i in range(AT_ONCE)}
    search.save(str(tmp_path / "searcher.pkl"))  # Tune's last save: trials 0..2 running
    for ended in ("t0", "t1"):
        search.on_trial_complete(ended, {"val/acc": _value(configs[int(ended[1:])])})
    configs[3] = search.suggest("t3")
    return storage, search, configs


def test_a_trial_drawn_before_the_stop_but_lost_by_tune_is_drawn_again_as_it_was(tmp_path):
    """Tune's last save predates trial 3, drawn from the study (TPE at random: 1 told trial,
    fewer than the start-up's 2) before the stop; that draw let trial 1 be told, so at the
    resume the study holds 2 told trials and a new draw for index 3 would read them. The resumed
    Tune asks for a trial in trial 3's place: it gets the config trial 3 was drawn with, the
    uninterrupted search's, on an Optuna trial of its own with index 3."""
    clean_configs, clean_study = _run(tmp_path, "clean.db", random.Random(0), startup_trials=2)
    storage, search, configs = _trial_3_drawn_after_the_last_save(tmp_path)
    search.on_trial_complete("t2", {"val/acc": _value(configs[2])})  # trial 1 told now
    assert [i for i, _, _ in _study(storage)] == [0, 1] and configs[3] == clean_configs[3]
    assert _resumed(tmp_path, storage, configs, startup_trials=2).configs == clean_configs
    assert sorted(_study(storage)) == sorted(clean_study)


def test_a_draw_reads_the_told_trials_alone_not_those_a_killed_driver_left_running(tmp_path):
    """A SIGKILL leaves the stopped driver's Optuna trials RUNNING, and trial 3, drawn before
    it but lost by Tune's last save, is asked again on an Optuna trial of its own: two RUNNING
    trials hold its parameters. A TPE that models running trials (Optuna 5's constant liar)
    would draw trials 4.. from them, unlike the uninterrupted search; the search's TPE reads
    told trials only, and the resumed search draws the uninterrupted one's configs. Its
    Optuna trial left WAITING (the stop fell between an enqueue and its ask) is no draw's
    either."""
    clean_configs, clean_study = _run(tmp_path, "clean.db", random.Random(0), startup_trials=2)
    storage, search, configs = _trial_3_drawn_after_the_last_save(tmp_path)
    search._study.enqueue_trial({"loss.beta": 9.0, "adapter.K": 4})  # never asked: killed
    resumed = _resumed(tmp_path, storage, configs, killed=True, startup_trials=2)
    assert resumed.configs == clean_configs
    assert sorted(_study(storage)) == sorted(clean_study)


def test_with_slack_a_trial_starts_while_trial_k_minus_n_runs_and_reads_one_fewer(tmp_path):
    """--draw-slack 1: trial k's draw reads trials 0..k-N-1, so it starts while trial k-N runs
    (a slot it ended first would idle without slack), never with N trials running; the draws
    do not depend on the order trials end in either."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'o.db'}")
    search = _searcher(storage, startup_trials=2, draw_slack=1)
    for i in range(AT_ONCE):
        assert search.suggest(f"t{i}") is not None
    for ended, value in (("t0", 0.5), ("t1", 0.7)):
        search.on_trial_complete(ended, {"val/acc": value})
    assert _study(storage) == []  # trial 0 is told once trial 3 is drawn (lag N+1 = 4)
    for i in (3, 4):  # their draws read fewer than 2 trials: random, at once
        assert search.suggest(f"t{i}") is not None
        search.on_trial_complete(f"t{i}", {"val/acc": 0.2})
    assert [i for i, _, _ in _study(storage)] == [0, 1]
    assert search.suggest("t5") is not None  # reads trials 0 and 1 while trial 2 runs
    assert search.suggest("t6") is None  # reads trial 2, still running
    search.on_trial_complete("t2", {"val/acc": 0.1})
    assert search.suggest("t6") is not None and search.suggest("t7") is not None
    assert search.suggest("x") is None  # N running
    first = _run(tmp_path, "a.db", random.Random(0), startup_trials=2, draw_slack=1)
    assert _run(tmp_path, "b.db", random.Random(3), startup_trials=2, draw_slack=1) == first
    assert first[0] != _run(tmp_path, "c.db", random.Random(0), startup_trials=2)[0]


def test_startup_trials_reach_the_searcher_and_a_resume_keeps_them(tmp_path):
    """--startup-trials and --draw-slack reach the searcher a dataset's search builds (Optuna's
    default and 0 without them); the sweep's record keeps them, so a --resume with another
    number is refused."""
    from conftest import sweep_plan
    from sweeps.base2novel import SWEEP
    from vacsr.errors import ConfigError
    from vacsr.sweep.plan.ownership import claim_state
    from vacsr.sweep.plan.plan import STARTUP_TRIALS
    from vacsr.sweep.search.resume_files import check_resume_files
    from vacsr.sweep.search.tune import study_search

    def plan(*argv):
        return sweep_plan(SWEEP, tmp_path, ["--datasets", "dtd", *argv], data=tmp_path / "data")

    for argv, startup, slack in (((), STARTUP_TRIALS, 0),
                                 (("--startup-trials", "2", "--draw-slack", "1"), 2, 1)):
        storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / f'{startup}.db'}")
        search = study_search(plan(*argv), "dtd", storage)
        assert search._startup == startup and search._sampler(3)._n_startup_trials == startup
        assert search.set_max_concurrency(3) and search._lag() == 3 + slack
    claim_state(plan("--startup-trials", "2", "--draw-slack", "1"), check_resume_files)
    claim_state(plan("--startup-trials", "2", "--draw-slack", "1", "--resume"),
                check_resume_files)
    with pytest.raises(ConfigError, match=r"--startup-trials 2 -> 10; --draw-slack 1 -> 0"):
        claim_state(plan("--resume"), check_resume_files)
