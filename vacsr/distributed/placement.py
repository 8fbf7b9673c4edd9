"""One placement-group cleaner for all the Ray Train runs of a sweep, instead of one per run.

A run's placement group (its workers' CPUs and GPUs) lives as long as the Ray job that made it, not
as long as the process that made it. When Tune stops a trial early (ASHA) it kills the trial actor,
and with it the run's Train controller, which then cannot remove its group: the group would hold
its resources until the sweep ends. Ray Train guards against that with a detached
PlacementGroupCleaner actor per run, a Python process of its own (~1.5 CPU-s to start, for a run
whose whole start-up is ~10). Here the sweep driver starts one named cleaner (`start_cleaner`), and
each run registers its group under the id of the actor that runs its controller; the cleaner
removes the group of a run whose actor the state API reports DEAD. A run that ends normally removes
its own group (Ray Train's shutdown) and unregisters.

An unknown state (the state API unreachable, the actor not yet listed) never counts as dead: a live
run's group is never removed on a guess.
"""
from __future__ import annotations

import logging
import threading
import time

import ray
from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback
from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

logger = logging.getLogger(__name__)

CLEANER_NAME = "vacsr_placement_group_cleaner"
CLEANER_NAMESPACE = "vacsr"
CHECK_INTERVAL_S = 2.0
STATE_TIMEOUT_S = 10


def _is_dead(actor_id: str) -> bool:
    """Whether the state API reports the actor DEAD (False when it cannot tell)."""
    from ray.util.state import get_actor

    try:
        state = get_actor(actor_id, timeout=STATE_TIMEOUT_S)
    except Exception:  # the API unreachable or slow: ask again next round
        return False
    return state is not None and state.state == "DEAD"


def _remove(group: PlacementGroup) -> None:
    try:
        if placement_group_table(group).get("state", "REMOVED") != "REMOVED":
            remove_placement_group(group)
    except Exception as exc:  # already gone, or the GCS busy: nothing left to hold
        logger.warning("could not remove placement group %s: %s", group.id.hex(), exc)


class SharedPlacementGroupCleaner:
    """The cleaner actor: owner actor id -> the placement group its run holds."""

    def __init__(self, check_interval_s: float = CHECK_INTERVAL_S) -> None:
        self._groups: dict[str, PlacementGroup] = {}
        self._removed: list[str] = []  # owners whose group this cleaner removed
        self._lock = threading.Lock()
        self._interval = check_interval_s
        threading.Thread(target=self._watch, name="placement-group-cleaner", daemon=True).start()

    def register(self, owner_id: str, group: PlacementGroup) -> None:
        with self._lock:
            self._groups[owner_id] = group  # a restarted worker group replaces the last one

    def unregister(self, owner_id: str) -> None:
        with self._lock:
            self._groups.pop(owner_id, None)

    def tracked(self) -> dict[str, str]:
        """Owner actor id -> placement group id, for inspection."""
        with self._lock:
            return {owner: group.id.hex() for owner, group in self._groups.items()}

    def removed(self) -> list[str]:
        with self._lock:
            return list(self._removed)

    def _watch(self) -> None:
        while True:
            time.sleep(self._interval)
            with self._lock:
                owners = list(self._groups)
            for owner in owners:
                if not _is_dead(owner):
                    continue
                with self._lock:
                    group = self._groups.pop(owner, None)
                if group is not None:
                    logger.warning("run actor %s is dead; removing its placement group %s",
                                   owner, group.id.hex())
                    _remove(group)
                    with self._lock:
                        self._removed.append(owner)


_started: list = []  # the handle that keeps the cleaner alive (a named actor is still counted)


def start_cleaner():
    """Start the shared cleaner, owned by the calling process (the sweep driver): it ends with
    it. Idempotent within a Ray instance; returns its handle."""
    cleaner = find_cleaner()
    if cleaner is None:
        cleaner = ray.remote(num_cpus=0, max_concurrency=4)(SharedPlacementGroupCleaner).options(
            name=CLEANER_NAME, namespace=CLEANER_NAMESPACE, get_if_exists=True).remote()
        _started[:] = [cleaner]
    return cleaner


def find_cleaner():
    """The shared cleaner's handle, or None where no driver started one."""
    try:
        return ray.get_actor(CLEANER_NAME, namespace=CLEANER_NAMESPACE)
    except ValueError:
        return None


class SharedCleanerCallback(ControllerCallback, WorkerGroupCallback):
    """Registers the run's placement group with the shared cleaner under `owner_id`, the actor that
    runs the controller (the Tune trial actor)."""

    def __init__(self, cleaner, owner_id: str) -> None:
        self._cleaner, self._owner_id = cleaner, owner_id

    def after_worker_group_start(self, worker_group) -> None:
        group = worker_group.get_worker_group_state().placement_group_handle.placement_group
        ray.get(self._cleaner.register.remote(self._owner_id, group))

    def _unregister(self) -> None:
        try:
            ray.get(self._cleaner.unregister.remote(self._owner_id), timeout=STATE_TIMEOUT_S)
        except Exception as exc:  # the cleaner gone with its driver: nothing to unregister from
            logger.debug("placement group cleaner unreachable: %s", exc)

    async def before_controller_shutdown(self) -> None:
        self._unregister()

    def before_controller_abort(self) -> None:
        self._unregister()
