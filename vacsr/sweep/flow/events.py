"""Progress events from the dataset tasks (and their Tune callbacks) to the driver's console.

The sink is found by name, not held as an actor handle: Tune pickles its callbacks into the
experiment state, and a handle to the previous driver's actor could not be restored by
`--resume`; the name is the same across driver restarts, its actor the new driver's.
"""
from __future__ import annotations

import ray


@ray.remote(num_cpus=0)
class EventLog:
    """Events in arrival order; the driver drains them."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def put(self, event: dict) -> None:
        self.events.append(event)

    def drain(self) -> list[dict]:
        events, self.events = self.events, []
        return events


def event_log_name(sweep: str) -> str:
    return f"vacsr-events-{sweep}"


def start_event_log(sweep: str):
    """The driver's EventLog actor (it dies with the driver)."""
    return EventLog.options(name=event_log_name(sweep), get_if_exists=True).remote()


class EventSink:
    """`sink(event)` sends one event to the sweep's EventLog; picklable, fire-and-forget, and a
    lost driver (no log to find) only loses progress lines."""

    def __init__(self, sweep: str) -> None:
        self.name = event_log_name(sweep)
        self._log = None

    def __getstate__(self) -> dict:
        return {"name": self.name, "_log": None}

    def __call__(self, event: dict) -> None:
        try:
            if self._log is None:
                self._log = ray.get_actor(self.name)
            self._log.put.remote(event)
        except Exception:  # ValueError: no such actor (the driver is gone); progress is optional
            self._log = None
