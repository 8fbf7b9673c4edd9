"""ASHA decided in creation order (vacsr/sweep/search/asha.py, rungs.py): one trial at a time it
stops what Ray's ASHAScheduler stops; with several at once, in any order of arrival, and across a
stop and --resume, it stops the same trials at the same rungs."""
from __future__ import annotations

import pickle
import random
from types import SimpleNamespace

import pytest
from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from vacsr.errors import ConfigError
from vacsr.sweep.search.asha import OrderedASHA
from vacsr.sweep.search.rungs import RungLedger
from vacsr.sweep.spec.schedule import ASHA, AshaSchedule

pytestmark = [pytest.mark.ray_api, pytest.mark.timeout(120)]


def _index(trial_id: str) -> int:
    return int(trial_id[1:])


class Order:
    """The searcher's side the scheduler uses: trial "t<k>" was created k-th; the trials it is
    told ended."""

    def __init__(self) -> None:
        self.told: dict[str, bool] = {}

    def creation_index(self, trial_id: str) -> int:
        return _index(trial_id)

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        self.told[trial_id] = error

    def note_stop(self, trial_id: str, value: float) -> None:
        pass


def _scheduler(path, max_epochs: int, schedule: AshaSchedule = ASHA) -> OrderedASHA:
    scheduler = OrderedASHA(RungLedger(path, schedule, max_epochs, "max"), Order(),
                            time_attr="epoch")
    scheduler.set_search_properties("val/acc", "max")
    return scheduler


class Gate:
    """The verdicts the scheduler posts to the dataset's gate actor
    (vacsr/sweep/search/rung_gate.py), as trial id -> {rung: verdict}."""

    def __init__(self) -> None:
        self.verdicts: dict[str, dict[int, str]] = {}

    def post(self, trial_id: str, rung: int, verdict: str) -> None:
        assert rung not in self.verdicts.setdefault(trial_id, {}), "a rung decided twice"
        self.verdicts[trial_id][rung] = verdict


class Tuning:
    """Tune's side of the scheduler protocol, as its TuneController drives it: `slots` trials
    run at once, the next result comes from a running trial picked at random, a paused trial
    holds no slot and goes on from its last epoch, a stop ends a trial where it is. With a
    gate, a trial told CONTINUE at a rung waits in its actor (running, no result) until the
    gate holds its verdict there."""

    def __init__(self, scheduler: OrderedASHA, curves: list[list[float]], slots: int,
                 rng: random.Random, gate: Gate | None = None) -> None:
        self.scheduler, self.curves, self.slots, self.rng = scheduler, curves, slots, rng
        self.gate = scheduler.gate = gate
        self.trials = [SimpleNamespace(trial_id=f"t{i}", status=Trial.PENDING, is_saving=False,
                                       last_result=None, epoch=0) for i in range(len(curves))]
        for trial in self.trials:
            scheduler.on_trial_add(self, trial)

    def get_trials(self):
        return self.trials

    def stop_trial(self, trial) -> None:
        if trial.status in (Trial.PENDING, Trial.PAUSED):
            self.scheduler.on_trial_remove(self, trial)
        elif trial.status == Trial.RUNNING:
            self.scheduler.on_trial_complete(self, trial, trial.last_result)
        trial.status = Trial.TERMINATED

    def step(self) -> bool:
        """One result; False once every trial ended."""
        while sum(t.status == Trial.RUNNING for t in self.trials) < self.slots:
            chosen = self.scheduler.choose_trial_to_run(self)
            if chosen is None:
                break
            assert chosen.status in (Trial.PENDING, Trial.PAUSED)
            chosen.status = Trial.RUNNING
        running = [t for t in self.trials if t.status == Trial.RUNNING and not self._blocked(t)]
        if not running:
            assert all(t.status in (Trial.TERMINATED, Trial.ERROR) for t in self.trials), \
                "a trial waits forever"
            return False
        trial = self.rng.choice(running)
        if trial.epoch == len(self.curves[_index(trial.trial_id)]):  # paused at its last report:
            self.scheduler.on_trial_complete(self, trial, trial.last_result)  # it returns
            trial.status = Trial.TERMINATED
            return True
        trial.epoch += 1
        trial.last_result = {"epoch": trial.epoch,
                             "val/acc": self.curves[_index(trial.trial_id)][trial.epoch - 1]}
        decision = self.scheduler.on_trial_result(self, trial, trial.last_result)
        if decision == TrialScheduler.PAUSE:
            trial.status = Trial.PAUSED
        elif decision == TrialScheduler.STOP or trial.epoch == len(
                self.curves[_index(trial.trial_id)]) and not self._blocked(trial):
            self.scheduler.on_trial_complete(self, trial, trial.last_result)
            trial.status = Trial.TERMINATED
        return True


    def _blocked(self, trial) -> bool:
        """A trial waiting in its actor for the verdict at the rung it reported last."""
        if self.gate is None or trial.epoch not in self.scheduler.ledger.rungs:
            return False
        verdict = self.gate.verdicts.get(trial.trial_id, {}).get(trial.epoch)
        assert verdict != "stop", "a trial told STOP is still running"  # stop_trial ends it
        return verdict is None


def _curves(rng: random.Random, max_epochs: int, count: int) -> list[list[float]]:
    """Learning curves of random lengths, with ties (accuracies on a small val split)."""
    return [[round(rng.random() * 4) / 4 + epoch / 10
             for epoch in range(rng.randint(1, max_epochs))] for _ in range(count)]


def _rays_stops(curves: list[list[float]], max_epochs: int) -> dict[str, int]:
    """Ray's own ASHAScheduler, built as the sweep's schedule says, trials one after another:
    trial id -> the epoch it stopped at."""
    ray_asha = ASHAScheduler(time_attr="epoch", metric="val/acc", mode="max",
                             max_t=ASHA.max_t(max_epochs), grace_period=ASHA.grace_period,
                             reduction_factor=ASHA.reduction_factor)
    stops = {}
    for index, curve in enumerate(curves):
        trial = SimpleNamespace(trial_id=f"t{index}")
        ray_asha.on_trial_add(None, trial)
        for epoch, value in enumerate(curve, 1):
            result = {"epoch": epoch, "val/acc": value}
            if ray_asha.on_trial_result(None, trial, result) == ASHAScheduler.STOP:
                stops[trial.trial_id] = epoch
                break
        ray_asha.on_trial_complete(None, trial, result)
    return stops


def _stops(scheduler: OrderedASHA) -> dict[str, int]:
    return {tid: note["rung"] for tid, note in scheduler.ledger.stops().items()}


def test_one_trial_at_a_time_it_stops_what_rays_asha_stops(tmp_path):
    """With one trial at a time every earlier trial has ended when one reports: the decisions
    are asynchronous ASHA's, as Ray's scheduler takes them (the sweep's tables with
    --concurrent-trials 1 stay what they were)."""
    rng = random.Random(3)
    for search in range(60):
        max_epochs = rng.choice((4, 8, 16))
        curves = _curves(rng, max_epochs, rng.randint(2, 12))
        tuning = Tuning(_scheduler(tmp_path / f"s{search}.json", max_epochs), curves, 1, rng)
        while tuning.step():
            pass
        assert _stops(tuning.scheduler) == _rays_stops(curves, max_epochs), (search, curves)


def test_any_order_of_arrival_gives_the_same_stops(tmp_path):
    """2 to 6 trials at once, results arriving in random order: each search stops the same
    trials at the same rungs as one trial at a time, and no trial waits forever."""
    rng, paused = random.Random(11), 0
    for search in range(80):
        max_epochs = rng.choice((4, 8, 16))
        curves = _curves(rng, max_epochs, rng.randint(4, 14))
        tuning = Tuning(_scheduler(tmp_path / f"s{search}.json", max_epochs), curves,
                        rng.randint(2, 6), rng)
        while tuning.step():
            paused += sum(t.status == Trial.PAUSED for t in tuning.trials)
        assert _stops(tuning.scheduler) == _rays_stops(curves, max_epochs), (search, curves)
    assert paused > 0  # trials waited at rungs


def test_trials_waiting_in_their_actors_give_the_same_stops_and_never_pause(tmp_path):
    """With the gate, a trial waits for its verdict in its actor: the same stops as one trial
    at a time, every rung a trial reached decided once, no trial waits forever, and none is
    paused (the oldest trials start first, so those a trial waits for run)."""
    rng, waited = random.Random(13), 0
    for search in range(80):
        max_epochs = rng.choice((4, 8, 16))
        curves = _curves(rng, max_epochs, rng.randint(4, 14))
        tuning = Tuning(_scheduler(tmp_path / f"s{search}.json", max_epochs), curves,
                        rng.randint(2, len(curves)), rng, gate=Gate())
        while tuning.step():
            assert not any(t.status == Trial.PAUSED for t in tuning.trials), (search, curves)
            waited += sum(tuning._blocked(t) for t in tuning.trials if t.status == Trial.RUNNING)
        assert _stops(tuning.scheduler) == _rays_stops(curves, max_epochs), (search, curves)
        posted = {(tid, rung) for tid, rungs in tuning.gate.verdicts.items() for rung in rungs}
        assert posted == {(tid, rung) for tid, entry in tuning.scheduler.ledger.trials.items()
                          for rung in entry["rungs"]}
    assert waited > 0  # trials waited in their actors


def test_a_trial_waits_in_its_actor_only_while_those_it_waits_for_run(tmp_path):
    """A trial whose comparison needs a trial that holds no resources (pending, paused) is
    paused instead: waiting in its actor, it could hold the slot that trial needs."""
    scheduler = _scheduler(tmp_path / "asha_rungs.json", 4)
    tuning = Tuning(scheduler, [[1.0] * 4] * 3, 3, random.Random(0), gate=Gate())
    t0, t1, t2 = tuning.trials
    t0.status, t1.status, t2.status = Trial.PAUSED, Trial.RUNNING, Trial.RUNNING
    result = {"epoch": 1, "val/acc": 1.0}
    assert scheduler.on_trial_result(tuning, t2, result) == TrialScheduler.PAUSE
    t0.status = Trial.RUNNING
    assert scheduler.on_trial_result(tuning, t1, result) == TrialScheduler.CONTINUE
    assert tuning.gate.verdicts == {}  # t1 waits for t0 in its actor
    assert scheduler.on_trial_result(tuning, t0, result) == TrialScheduler.CONTINUE
    assert tuning.gate.verdicts == {"t0": {1: "continue"}, "t1": {1: "continue"},
                                    "t2": {1: "continue"}}


def test_free_running_it_decides_as_rays_asha_in_the_order_results_arrive(tmp_path):
    """--free-running: each report is decided at once against the values reported at its rung
    before it, as Ray's ASHAScheduler decides the same results in the same order."""
    rng = random.Random(2)
    for search in range(40):
        max_epochs = rng.choice((4, 8, 16))
        curves = _curves(rng, max_epochs, rng.randint(4, 12))
        scheduler = _scheduler(tmp_path / f"s{search}.json", max_epochs)
        scheduler.ordered = False
        tuning = Tuning(scheduler, curves, rng.randint(2, 6), rng)
        ray_asha = ASHAScheduler(time_attr="epoch", metric="val/acc", mode="max",
                                 max_t=ASHA.max_t(max_epochs), grace_period=ASHA.grace_period,
                                 reduction_factor=ASHA.reduction_factor)
        for trial in tuning.trials:
            ray_asha.on_trial_add(None, trial)
        decide = scheduler.on_trial_result

        def both(controller, trial, result, decide=decide, ray_asha=ray_asha):
            ours = decide(controller, trial, result)
            assert ours == ray_asha.on_trial_result(None, trial, result), (search, result)
            return ours

        scheduler.on_trial_result = both
        while tuning.step():
            pass


def test_a_resumed_search_decides_from_its_ledger(tmp_path):
    """A stop at a random result, then --resume: Tune unpickles the scheduler as it was at the
    start and restores each trial from a checkpoint up to an epoch behind (its state is saved
    now and then), a trial the stopped search had ended among them. The resumed scheduler
    reads the ledger and stops the same trials at the same rungs."""
    rng = random.Random(5)
    for search in range(60):
        max_epochs = rng.choice((4, 8))
        curves = _curves(rng, max_epochs, rng.randint(4, 10))
        path = tmp_path / f"s{search}.json"
        at_start = pickle.dumps(_scheduler(path, max_epochs))  # as Tune keeps it
        tuning = Tuning(pickle.loads(at_start), curves, rng.randint(1, 4), rng)
        for _ in range(rng.randint(1, sum(map(len, curves)))):
            if not tuning.step():
                break
        resumed = Tuning(pickle.loads(at_start), curves, tuning.slots, rng)
        for before, after in zip(tuning.trials, resumed.trials):
            behind = rng.randint(0, 1)
            after.epoch = max(0, before.epoch - behind)
            ended = before.status == Trial.TERMINATED and not behind
            after.status = Trial.TERMINATED if ended else \
                Trial.PAUSED if after.epoch else Trial.PENDING
        while resumed.step():
            pass
        assert _stops(resumed.scheduler) == _rays_stops(curves, max_epochs), (search, curves)


def test_a_stop_is_noted_with_its_rung_and_the_values_it_was_compared_with(tmp_path):
    """What the sweep records on a stopped trial's MLflow run: the rung, its value there and
    the values of the earlier trials at that rung; a trial whose earlier trial has not reached
    the rung waits there (PAUSE)."""
    halving = AshaSchedule(grace_period=1, reduction_factor=2)
    scheduler = _scheduler(tmp_path / "asha_rungs.json", 8, halving)  # rungs 1, 2, 4, 8
    tuning = Tuning(scheduler, [[50.0] * 8, [40.0] * 8, [10.0] * 8], 3, random.Random(0))
    for trial in tuning.trials:
        trial.status = Trial.RUNNING

    def report(index: int, epoch: int) -> str:
        trial = tuning.trials[index]
        trial.epoch, trial.last_result = epoch, {"epoch": epoch, "val/acc": tuning.curves[
            index][epoch - 1]}
        return scheduler.on_trial_result(tuning, trial, trial.last_result)

    assert report(2, 1) == TrialScheduler.PAUSE  # t0 and t1 have not reported epoch 1
    tuning.trials[2].status = Trial.PAUSED
    assert report(0, 1) == TrialScheduler.CONTINUE
    assert report(1, 1) == TrialScheduler.STOP  # 40 against 50: below the median
    assert tuning.trials[2].status == Trial.TERMINATED  # decided once t1 reported: stopped
    assert scheduler.ledger.stops() == {
        "t1": {"rung": 1, "value": 40.0, "compared": [50.0]},
        "t2": {"rung": 1, "value": 10.0, "compared": [40.0, 50.0]}}
    assert RungLedger(tmp_path / "asha_rungs.json", halving, 8, "max").stops() == \
        scheduler.ledger.stops()  # as the file holds them


def test_a_damaged_ledger_is_refused_in_one_line(tmp_path):
    path = tmp_path / "asha_rungs.json"
    for damaged in ("[", "[]", '{"t0": {"rungs": {}}}'):
        path.write_text(damaged)
        with pytest.raises(ConfigError, match=r"asha_rungs.json: not a rung ledger"):
            RungLedger(path, ASHA, 8, "max")


def test_a_trial_tune_ends_without_telling_is_not_waited_for(tmp_path):
    """Tune sets a trial ERROR without calling the scheduler or the searcher when the actor it
    reuses fails to reset: the trials created after it must not wait for it at the rung, and
    the searcher is told it failed (its later draws wait for it too)."""
    scheduler = _scheduler(tmp_path / "asha_rungs.json", 4)
    tuning = Tuning(scheduler, [[1.0] * 4, [2.0] * 4], 2, random.Random(0))
    tuning.trials[0].status = Trial.ERROR  # its reset failed before it reported anything
    while tuning.step():
        pass
    assert scheduler.searcher.told == {"t0": True}
    assert scheduler.ledger.trials["t1"]["passed"] == [1, 4]  # it went on


@pytest.mark.parametrize("concurrent, trials, workers, free_running, gate", [
    (4, 8, 1, False, True),  # trials side by side, each in its actor: they wait at the gate
    (1, 8, 1, False, False),  # one at a time: every decision is there when a trial reports
    (4, 1, 1, False, False),  # a single trial has nobody to wait for
    (4, 8, 2, False, False),  # Ray Train workers report, not the actor: paused instead
    (4, 8, 1, True, False),  # free-running ASHA never waits
])
def test_a_gate_is_started_only_where_a_trial_can_wait_in_its_actor(tmp_path, concurrent, trials,
                                                                    workers, free_running, gate):
    from conftest import built_plan
    from sweeps.base2novel import SWEEP
    from vacsr.config import load_config
    from vacsr.sweep.search.tune import rung_gate_spec
    from vacsr.sweep.spec.space import Int

    config = load_config(overrides=[f"train.workers={workers}", "train.epochs=5"])
    plan = built_plan(SWEEP, tmp_path, configs={"dtd": config},
                      spaces={"dtd": {"train.epochs": Int(3, 5)}}, trials=trials,
                      free_running=free_running)
    spec = rung_gate_spec(plan, "dtd", "dtd-0123456789ab", concurrent)
    assert (spec is not None) == gate
    if gate:  # named after the search's Tune experiment, with the ledger's rungs (1, 4)
        assert spec.rungs == (1, 4) and "dtd-0123456789ab" in spec.name
