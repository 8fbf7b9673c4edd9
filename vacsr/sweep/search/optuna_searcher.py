"""A Tune searcher over an Optuna study, on the public APIs of both: Tune's `Searcher` interface
and Optuna's ask-and-tell (`Study.ask`, `Study.tell`, `Trial.report`, `Study.enqueue_trial`).

The study lives in an RDB storage, so its trials outlive a stopped driver. The driver marks the
Optuna trials it leaves RUNNING as FAIL (the restored searcher does, where a SIGKILL left them
RUNNING); `--resume` then continues those Tune trials from their checkpoints, and their results go
to a fresh Optuna trial with the same parameters (Optuna refuses to update a finished one); so do
those of a trial that errored on a full disk or a tracking outage and is resumed. The searcher keeps
Tune's max_concurrent_trials itself: Tune's ConcurrencyLimiter, restored, would drop the ends of the
trials a resume continues. A Tune trial whose Optuna trial was told its value before the stop
(COMPLETE or PRUNED) is not told again, whatever Tune's saved state says.

Each Optuna trial carries the id of the Tune trial it configures (user attribute TUNE_TRIAL_ATTR)
and the searcher's count of the Tune trials it configured before (CREATION_ATTR), written when the
trial is created: the order selection breaks ties by (vacsr/sweep/search/selection.py).

Tune saves its state, this searcher's with it, now and then; a stop can come after the searcher
created a trial but before Tune saved it. `--resume` then restores a searcher that has not created
it, and Tune asks for a new trial in its place. So that the new trial is the lost one again, a
trial's values depend only on the sampler seed, its creation index and the trials finished before
it: each index draws from a TPE sampler seeded for that index that reads told trials alone (not
from one random stream, whose position the restored searcher would not share, nor from the
trials running, which are not the uninterrupted search's after a stop), and the start points are
enqueued by index. The replacement also gets the lost trial's index, and selection's order with
it. Where the lost trial was told before the stop, the replacement takes its Optuna trial (its
values) and is not told again: the study holds each index's value once, as an uninterrupted
search's does. Where it was drawn but not told, the replacement takes its parameters (a trial is
tagged with its index only once drawn whole): drawn again, it would read the trials told since,
which its draw did not see (trial j is told once trial j+L-1 is drawn, below).

With N trials of a dataset at once (Tune's max_concurrent_trials) and a lag L = N + slack
(--draw-slack, 0 by default), trial k is drawn only once trials 0..k-L have ended, and the study
is told the trials' values in creation order, trial j's only after trial j+L-1 was drawn: so trial
k's draw sees trials 0..k-L, whatever order they ended in, and the study numbers its trials in
creation order. A trial that ends early waits, untold, until those created before it are told.
With L = N a slot whose trial ended before trial k-N stays idle until that one ends; each unit of
slack lets one more trial start in it, and each draw reads one trial fewer. While the sampler
draws at random, no draw waits: TPE samples at random until S trials are told (Optuna's
`n_startup_trials`: --startup-trials), and trial k's draw under that rule sees at most k-L+1
told trials, so for k-L+1 < S its draw is its seed's and index's alone, whatever has been told;
such a trial starts as soon as fewer than N run. On --resume the trials the stopped driver left
FAIL are opened again at once, in creation order, before anything is drawn: the study then holds
their values in the order an uninterrupted search gave them (Optuna's TPE sorts trials by value,
ties in trial-number order).

Why not Ray's `OptunaSearch`, which takes `storage=`, `study_name=` and `points_to_evaluate=`
too: restored on `--resume`, it reports a continued trial to the Optuna trial the stopped driver
marked FAIL, which raises, and its final value never reaches the study (so the resumed search
samples other configs than an uninterrupted one would); nor does it record the Tune trial id
that selection's creation order needs. tests/sweep/test_optuna_searcher.py shows both on the
installed Ray.

Tune pickles the searcher twice (the Tuner's state and the searcher's own checkpoint, both in the
sweep's folder). The storage's URL may hold the database's password, so what is pickled holds
its redacted form and the Optuna trials by number; unpickled, the searcher takes the storage this
process opened from the sweep's `--optuna-storage` (vacsr/sweep/plan/studies.py, `opened_storage`).
"""
from __future__ import annotations

import math
import pickle
import zlib
from typing import Any, Callable

import optuna
from optuna.trial import TrialState
from ray.tune.search import Searcher

from vacsr.redact import redact_uri
from vacsr.sweep.plan.plan import DRAW_SLACK, STARTUP_TRIALS

# Optuna user attributes: the Tune trial an Optuna trial configures, and how many Tune trials
# the searcher created before it
TUNE_TRIAL_ATTR = "tune_trial_id"
CREATION_ATTR = "creation_index"
# Study user attribute prefix: a Tune trial that repeats one a stop lost after the study was told
# its value -> the creation index it shares with it (its Optuna trial is the lost one's)
REPEAT_ATTR = "creation_index_of:"
_TOLD = (TrialState.COMPLETE, TrialState.PRUNED)  # the states a trial's tell leaves


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """{"loss.beta": 1} -> {"loss": {"beta": 1}}: Tune shows and stores a trial's config nested."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *sections, name = key.split(".")
        node = nested
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = value
    return nested


def _tag(trial: optuna.Trial, trial_id: str, index: int) -> None:
    """Which Tune trial an Optuna trial configures, and its place in the creation order."""
    trial.set_user_attr(TUNE_TRIAL_ATTR, trial_id)
    trial.set_user_attr(CREATION_ATTR, index)


class OptunaStudySearch(Searcher):
    """Suggests each Tune trial's config from `space(trial)` (define-by-run: it calls the trial's
    `suggest_*`) on a new trial of the study `study_name` in `storage`, and tells the study the
    trial's last `metric`. `points_to_evaluate` are the first trials; `seed` with a trial's
    creation index seeds the TPE sampler that draws it."""

    # what a searcher pickled before the settings existed drew with, whatever the defaults now
    _startup, _slack = 10, 0

    def __init__(self, space: Callable[[optuna.Trial], Any], *, metric: str, mode: str,
                 storage, study_name: str, seed: int,
                 points_to_evaluate: list[dict] | None = None,
                 num_samples: int | None = None, ordered: bool = True,
                 startup_trials: int = STARTUP_TRIALS, draw_slack: int = DRAW_SLACK) -> None:
        from vacsr.sweep.plan.studies import remember_storage

        super().__init__(metric=metric, mode=mode)
        remember_storage(storage)  # what a copy unpickled in this process reopens
        self._space, self._storage, self._seed = space, storage, seed
        self._startup = startup_trials  # told trials before TPE reads them (each draw's sampler)
        self._slack = draw_slack  # trial k's draw reads trials 0..k-N-slack (ordered)
        self._points = list(points_to_evaluate or [])
        self._study = optuna.create_study(
            storage=storage, study_name=study_name, load_if_exists=True,
            sampler=self._sampler(0),
            pruner=optuna.pruners.NopPruner(),  # ASHA stops trials, not Optuna
            direction="minimize" if mode == "min" else "maximize")
        self._created = 0  # Tune trials this searcher configured: the next one's creation index
        self._trials: dict[str, optuna.Trial] = {}  # Tune trial id -> its current Optuna trial
        self._told: set[str] = set()  # Tune trials whose final value the study has
        self._max_concurrent = 0  # Tune's max_concurrent_trials (set_max_concurrency); 0: none
        self._running: set[str] = set()  # Tune trials suggested here and not ended yet
        self._num_samples = num_samples  # the trials the search draws; None: unknown
        self._index: dict[str, int] = {}  # Tune trial id -> its creation index
        self._ended: dict[str, tuple] = {}  # ended, not told yet: id -> (value or None, error)
        self._last: dict[str, float] = {}  # each trial's last reported metric
        self._errored: set[str] = set()  # told FAIL on an error: opened again only if resumed
        self._reopened = True  # a restored searcher opens its FAIL trials again first
        self._ordered = ordered  # False (--free-running): draw and tell as trials end
        self._stop_values: dict[str, float] = {}  # trials ASHA stopped: their value there

    def _sampler(self, index: int) -> optuna.samplers.TPESampler:
        """Trial `index`'s sampler. It models told trials only: with Optuna's constant liar (its
        default from Optuna 5) a draw reads the study's RUNNING trials too, and after a stop
        those are not the uninterrupted search's (a lost trial asked again, say)."""
        return optuna.samplers.TPESampler(seed=zlib.crc32(f"{self._seed}:{index}".encode()),
                                          n_startup_trials=self._startup, constant_liar=False)

    # ------------------------------------------------------------ Tune's Searcher interface
    def set_max_concurrency(self, max_concurrent: int) -> bool:
        """Tune's max_concurrent_trials, held here (True) instead of in the ConcurrencyLimiter
        Tune wraps a searcher in: restored on --resume, the limiter knows no trial as running
        and drops the end of every trial the resume continues, so their values never reached
        the study."""
        self._max_concurrent = max_concurrent
        return True

    def note_stop(self, trial_id: str, value: float) -> None:
        """ASHA stopped the trial at a rung with `value` there: the value it is told, even if a
        resumed trial reported an epoch more before its stop reached it."""
        self._stop_values[trial_id] = value

    def creation_index(self, trial_id: str) -> int:
        """The trial's place in the creation order (OrderedASHA decides in it)."""
        return self._index[trial_id]

    def suggest(self, trial_id: str) -> dict | None:
        self._reopen_stopped()
        index = self._created
        self._tell_ended()
        if self._max_concurrent and self._waits(index):
            return None  # Tune asks again
        drawn = self._drawn_at(index)
        if drawn is not None and drawn.state in _TOLD:
            return self._repeat(trial_id, index, drawn)
        if drawn is not None:  # drawn, not told: a new draw would read trials told since
            trial = self._ask_again(drawn)
        else:
            self._study.sampler = self._sampler(index)
            if index < len(self._points):  # taken by the ask right after (no other trial
                self._study.enqueue_trial(self._points[index])  # waits: fail_running_trials)
            trial = self._study.ask()
            self._space(trial)
        _tag(trial, trial_id, index)  # once drawn whole, before the trial runs
        self._created += 1
        self._trials[trial_id] = trial
        self._index[trial_id] = index
        self._running.add(trial_id)
        return nest(trial.params)

    def _drawn_at(self, index: int) -> optuna.trial.FrozenTrial | None:
        """The study's trial of creation index `index`, a told one (COMPLETE or PRUNED) if there
        is one: Tune's saved state, and this searcher's with it, predates the stop, which came
        after that trial was drawn; Tune asks for a new trial in the lost one's place."""
        found = None
        for frozen in self._study.get_trials(deepcopy=False):
            if frozen.user_attrs.get(CREATION_ATTR) == index:
                if frozen.state in _TOLD:
                    return frozen
                found = found or frozen
        return found

    def _repeat(self, trial_id: str, index: int, told: optuna.trial.FrozenTrial) -> dict:
        """The lost trial again, on its Optuna trial, told already: the study holds each
        creation index's value once, as an uninterrupted search's does (a second COMPLETE trial
        would count twice in the sampler and the importance analysis). Its Tune trial id goes
        to the study's user attributes, for selection's creation order."""
        self._study.set_user_attr(f"{REPEAT_ATTR}{trial_id}", index)
        study_id = self._storage.get_study_id_from_name(self._study.study_name)
        self._created += 1
        number = self._storage.get_trial_id_from_study_id_trial_number(study_id, told.number)
        self._trials[trial_id] = optuna.Trial(self._study, number)
        self._index[trial_id] = index
        self._told.add(trial_id)
        self._running.add(trial_id)
        return nest(told.params)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self._reopen_stopped()
        self._ended.pop(trial_id, None)  # a failed trial --resume continues
        self._errored.discard(trial_id)
        trial = self._live_trial(trial_id)
        if trial is not None and isinstance(result.get(self.metric), (int, float)):
            self._last[trial_id] = float(result[self.metric])
            trial.report(float(result[self.metric]), int(result["training_iteration"]))

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        """Noted; told once every trial created before it is (`_tell_ended`). A trial Tune stops
        while it is paused (vacsr/sweep/search/asha.py) ends without a result: its value is the
        last it reported, as for one stopped at its report."""
        self._reopen_stopped()
        self._running.discard(trial_id)
        if trial_id in self._told or trial_id not in self._trials:
            return
        value = result.get(self.metric) if result is not None \
            else None if error else self._last.get(trial_id)
        if not error and trial_id in self._stop_values:
            value = self._stop_values[trial_id]
        self._ended[trial_id] = (value, error)
        self._tell_ended()

    # ------------------------------------------------------------ telling in creation order
    def _waits(self, index: int) -> bool:
        """Whether the trial of creation index `index` must wait: N trials run, or its draw
        reads the study (TPE past its random start-up) and trials 0..index-lag have not all
        been told; free-running, only while N trials run."""
        if len(self._running) >= self._max_concurrent:
            return True
        sees = index - self._lag() + 1  # the told trials its draw may read: 0..k-lag
        return self._ordered and sees >= self._startup and self._untold_below(sees)

    def _lag(self) -> int:
        """How far a draw runs ahead of the study: trial k's draw reads trials 0..k-lag."""
        return self._max_concurrent + self._slack

    def _untold_below(self, stop: int) -> bool:
        """Whether a trial created before index `stop` has not been told."""
        return any(i < stop and tid not in self._told and tid not in self._errored
                   for tid, i in self._index.items())

    def _tell_ended(self) -> None:
        """Tell the ended trials in creation order, up to the first that has not ended, and
        while more trials are to be drawn, none created after index created-lag: the next draw
        (index created) must see exactly trials 0..created-lag. Free-running, or without a limit
        (none set), each is told as it ends: what a draw sees depends on timing then anyway."""
        if not self._max_concurrent or not self._ordered:
            for trial_id in list(self._ended):
                self._tell(trial_id, *self._ended.pop(trial_id))
            return
        limit = math.inf
        if self._num_samples is None or self._created < self._num_samples:
            limit = self._created - self._lag()
        for trial_id in sorted(self._index, key=self._index.get):
            if trial_id in self._told or trial_id in self._errored:
                continue
            if self._index[trial_id] > limit or trial_id not in self._ended:
                return
            self._tell(trial_id, *self._ended.pop(trial_id))

    def _tell(self, trial_id: str, value, error: bool) -> None:
        trial = self._live_trial(trial_id)
        if trial is None:
            return
        if isinstance(value, (int, float)) and math.isfinite(value):
            self._study.tell(trial, float(value))
        elif isinstance(value, (int, float)) or error:  # a nan metric: the run diverged
            # not noted as told: a trial that errored on a full disk or a tracking outage is
            # resumed (search/recovery.py), and its results then go to a fresh Optuna trial
            self._study.tell(trial, state=TrialState.FAIL)
            self._errored.add(trial_id)
            return
        else:
            self._study.tell(trial, state=TrialState.PRUNED)  # stopped before reporting it
        self._told.add(trial_id)

    def save(self, checkpoint_path: str) -> None:
        """What a restored search needs to draw what the stopped one would have drawn next (each
        draw's sampler is seeded by its creation index), without the storage's credentials."""
        with open(checkpoint_path, "wb") as out:
            pickle.dump(self.__getstate__(), out)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as src:
            self.__setstate__(pickle.load(src))

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_storage"] = redact_uri(self._storage.url)
        state["_study"] = self._study.study_name
        state["_trials"] = {tid: trial.number for tid, trial in self._trials.items()}
        return state

    def __setstate__(self, state: dict) -> None:
        from vacsr.sweep.plan.studies import opened_storage

        state = dict(state)
        storage = opened_storage(state["_storage"])
        study = optuna.load_study(study_name=state["_study"], storage=storage,
                                  sampler=optuna.samplers.TPESampler(),
                                  pruner=optuna.pruners.NopPruner())
        study_id = storage.get_study_id_from_name(study.study_name)
        trial_id = storage.get_trial_id_from_study_id_trial_number
        state["_trials"] = {tid: optuna.Trial(study, trial_id(study_id, number))
                            for tid, number in state["_trials"].items()}
        state["_storage"], state["_study"] = storage, study
        self.__dict__.update(state)
        self._reopened = False

    def _reopen_stopped(self) -> None:
        """Once, in a restored searcher: the trials a stop left FAIL (not those that failed on
        an error) get their new Optuna trials now, in creation order, before any other trial
        is created or told."""
        if self._reopened:
            return
        self._reopened = True
        # a SIGKILL closes no records: its trials are left RUNNING, and one it enqueued but did
        # not ask yet WAITING, which this study's next ask would take as its draw
        from vacsr.sweep.plan.studies import fail_running_trials
        fail_running_trials(self._storage, self._study.study_name)
        for trial_id in sorted(self._index, key=self._index.get):
            if trial_id not in self._errored:
                self._live_trial(trial_id)

    # ------------------------------------------------------------ reopening
    def _live_trial(self, trial_id: str) -> optuna.Trial | None:
        """The Optuna trial that takes `trial_id`'s results; a new one with the same parameters
        when a stopped driver left the old one FAIL. None for a trial already told (or unknown
        to this searcher), in this process or before the stop: Tune's saved state (and this
        searcher's, saved with it) can predate a tell that reached the study, and telling the
        study twice would count one trial twice in the sampler and the importance analysis."""
        if trial_id in self._told or trial_id not in self._trials:
            return None
        trial = self._trials[trial_id]
        study_id = self._storage.get_study_id_from_name(self._study.study_name)
        frozen = self._storage.get_trial(
            self._storage.get_trial_id_from_study_id_trial_number(study_id, trial.number))
        if frozen.state in _TOLD:
            self._told.add(trial_id)
            return None
        if frozen.state.is_finished():
            trial = self._trials[trial_id] = self._ask_again(frozen)
            _tag(trial, trial_id, frozen.user_attrs.get(CREATION_ATTR, frozen.number))
        return trial

    def _ask_again(self, frozen: optuna.trial.FrozenTrial) -> optuna.Trial:
        """A new Optuna trial with `frozen`'s parameters (Optuna updates no finished trial)."""
        self._study.enqueue_trial(frozen.params, skip_if_exists=False)
        return self._study.ask(fixed_distributions=frozen.distributions)
