"""A Tune searcher over an Optuna study, on the public APIs of both: Tune's `Searcher` interface
and Optuna's ask-and-tell (`Study.ask`, `Study.tell`, `Trial.report`, `Study.enqueue_trial`).

The study lives in an RDB storage, so its trials outlive a stopped driver. The driver marks the
Optuna trials it leaves RUNNING as FAIL; `--resume` then continues those Tune trials from their
checkpoints, and their results go to a fresh Optuna trial with the same parameters (Optuna refuses
to update a finished one); so do those of a trial that errored on a full disk or a tracking outage
and is resumed. The searcher keeps Tune's max_concurrent_trials itself: Tune's ConcurrencyLimiter,
restored, would drop the ends of the trials a resume continues. A Tune trial whose Optuna trial
was told its value before the stop (COMPLETE or PRUNED) is not told again, whatever Tune's saved
state says.

Each Optuna trial carries the id of the Tune trial it configures (user attribute TUNE_TRIAL_ATTR)
and the searcher's count of the Tune trials it configured before (CREATION_ATTR), written when the
trial is created: the order selection breaks ties by (vacsr/sweep/search/selection.py).

Tune saves its state, this searcher's with it, now and then; a stop can come after the searcher
created a trial but before Tune saved it. `--resume` then restores a searcher that has not created
it, and Tune asks for a new trial in its place. So that the new trial is the lost one again, a
trial's values depend only on the sampler seed, its creation index and the trials finished before
it: each index draws from a TPE sampler seeded for that index (not from one random stream, whose
position the restored searcher would not share), and the start points are enqueued by index. The
replacement also gets the lost trial's index, and selection's order with it.

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

# Optuna user attributes: the Tune trial an Optuna trial configures, and how many Tune trials
# the searcher created before it
TUNE_TRIAL_ATTR = "tune_trial_id"
CREATION_ATTR = "creation_index"


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

    def __init__(self, space: Callable[[optuna.Trial], Any], *, metric: str, mode: str,
                 storage, study_name: str, seed: int,
                 points_to_evaluate: list[dict] | None = None) -> None:
        from vacsr.sweep.plan.studies import remember_storage

        super().__init__(metric=metric, mode=mode)
        remember_storage(storage)  # what a copy unpickled in this process reopens
        self._space, self._storage, self._seed = space, storage, seed
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

    def _sampler(self, index: int) -> optuna.samplers.TPESampler:
        return optuna.samplers.TPESampler(seed=zlib.crc32(f"{self._seed}:{index}".encode()))

    # ------------------------------------------------------------ Tune's Searcher interface
    def set_max_concurrency(self, max_concurrent: int) -> bool:
        """Tune's max_concurrent_trials, held here (True) instead of in the ConcurrencyLimiter
        Tune wraps a searcher in: restored on --resume, the limiter knows no trial as running
        and drops the end of every trial the resume continues, so their values never reached
        the study."""
        self._max_concurrent = max_concurrent
        return True

    def suggest(self, trial_id: str) -> dict | None:
        if self._max_concurrent and len(self._running) >= self._max_concurrent:
            return None  # Tune asks again once a trial ends
        index = self._created
        self._study.sampler = self._sampler(index)
        if index < len(self._points):  # taken by the ask right after (no other trial waits:
            self._study.enqueue_trial(self._points[index])  # fail_running_trials)
        trial = self._study.ask()
        _tag(trial, trial_id, index)  # in the study before the trial runs
        self._space(trial)
        self._created += 1
        self._trials[trial_id] = trial
        self._running.add(trial_id)
        return nest(trial.params)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        trial = self._live_trial(trial_id)
        if trial is not None and isinstance(result.get(self.metric), (int, float)):
            trial.report(float(result[self.metric]), int(result["training_iteration"]))

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        self._running.discard(trial_id)
        trial = self._live_trial(trial_id)
        if trial is None:
            return
        value = (result or {}).get(self.metric)
        if isinstance(value, (int, float)) and math.isfinite(value):
            self._study.tell(trial, float(value))
        elif isinstance(value, (int, float)) or error:  # a nan metric: the run diverged
            # not noted as told: a trial that errored on a full disk or a tracking outage is
            # resumed (search/recovery.py), and its results then go to a fresh Optuna trial
            self._study.tell(trial, state=TrialState.FAIL)
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
        if frozen.state in (TrialState.COMPLETE, TrialState.PRUNED):
            self._told.add(trial_id)
            return None
        if frozen.state.is_finished():
            self._study.enqueue_trial(frozen.params, skip_if_exists=False)
            trial = self._trials[trial_id] = self._study.ask(
                fixed_distributions=frozen.distributions)
            _tag(trial, trial_id, frozen.user_attrs.get(CREATION_ATTR, frozen.number))
        return trial
