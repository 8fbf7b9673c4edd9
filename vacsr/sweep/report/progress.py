"""What the researcher sees while a sweep runs: one line per finished trial and per final seed run,
and a progress bar over all trials (datasets done / running, best val so far per dataset, ETA).

On a terminal the bar is a tqdm bar; in a log (`ray job submit`, CI) it is a plain status line
every `interval_s`, so no carriage returns garble the job log.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Mapping, TextIO

from tqdm import tqdm


class SweepProgress:
    def __init__(self, name: str, datasets: list[str], trials_per_dataset: int | Callable,
                 done: list[str],
                 metric: str, stream: TextIO | None = None, interval_s: float = 60.0,
                 unit_costs: Mapping[str, tuple[float, float]] | None = None,
                 lanes: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self.metric, self.stream = name, metric, stream or sys.stderr
        self.clock = clock
        self.datasets = {d: "done" if d in done else "waiting" for d in datasets}
        # trials per dataset: one number, or a function of the dataset (SweepPlan.trials_of)
        of = trials_per_dataset if callable(trials_per_dataset) else lambda d: trials_per_dataset
        self.planned = {d: int(of(d)) for d in datasets}
        self.trials = {d: self.planned[d] if d in done else 0 for d in datasets}
        self.total = sum(self.planned.values())
        self.best: dict[str, float] = {}
        self.interval_s, self.last_status = interval_s, self.clock()
        self.start, self.start_done = self.clock(), sum(self.trials.values())
        self.last_piece_end = self.start  # when the last trial (or unit) ended
        self.cache = [0, 0]  # evaluation inputs the prefix cache served, of all encoded
        # per unit the plan's wall seconds of a trial and of its final seeds, and the units
        # searched at once: the ETA then follows the units' own lengths (`_units_left`)
        self.unit_costs, self.lanes = dict(unit_costs or {}), max(1, lanes)
        self.piece_start: dict[str, float] = {}  # running unit -> when its current trial (or
        # its final seeds) began: the ETA credits the time spent on it (`_units_left`)
        self.start_left = self._units_left() if self.unit_costs else 0.0
        self.bar = None
        if getattr(self.stream, "isatty", lambda: False)():
            self.bar = tqdm(total=self.total, initial=sum(self.trials.values()), unit="trial",
                            file=self.stream, dynamic_ncols=True, leave=False)
            self._refresh()

    def _summary(self) -> str:
        counts = {s: sum(v == s for v in self.datasets.values()) for s in ("done", "running")}
        best = " ".join(f"{d}={v:.1f}" for d, v in self.best.items())
        return (f"datasets {counts['done']}/{len(self.datasets)} done, {counts['running']} "
                f"running; best {self.metric}: {best or '-'}")

    def _refresh(self) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(self._summary(), refresh=True)

    def line(self, text: str) -> None:
        """A permanent line (above the bar on a terminal)."""
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def started(self, dataset: str) -> None:
        self.datasets[dataset] = "running"
        self.piece_start[dataset] = self.clock()
        self._refresh()

    def event(self, event: dict) -> None:
        """An event a dataset's task sent (vacsr/sweep/search/tune.py TrialEvents,
        vacsr/sweep/final/seeds.py)."""
        dataset = event["dataset"]
        served, evaluated = event.get("cache", (0, 0))
        self.cache = [self.cache[0] + served, self.cache[1] + evaluated]
        if event["event"] == "trial":
            self.last_piece_end = self.clock()
            if dataset in self.piece_start:  # the next trial, or the seeds, begin
                self.piece_start[dataset] = self.last_piece_end
            self.trials[dataset] += 1
            value = event.get("value")
            if value is not None and value > self.best.get(dataset, float("-inf")):
                self.best[dataset] = value
            shown = "-" if value is None else f"{value:.2f}"
            self.line(f"[{self.name}] {dataset}: trial {self.trials[dataset]} {event['status']} "
                      f"after {event['epochs']} epoch(s), {self.metric}={shown}")
            if self.bar is not None:
                self.bar.update(1)
        elif event["event"] == "final":
            metrics = ", ".join(f"{k}={v:.2f}" for k, v in event["metrics"].items()
                                if not k.startswith(("eval_", "num_", "uncertainty_", "sigma_")))
            self.line(f"[{self.name}] {dataset} final seed {event['seed']}: {metrics}")
        elif event["event"] == "note":  # something the task did otherwise than asked, and why
            self.line(f"[{self.name}] {dataset}: {event['text']}")
        self._refresh()
        self.tick()

    def finished(self, dataset: str, failed: str | None = None) -> None:
        self.datasets[dataset] = "failed" if failed else "done"
        self.piece_start.pop(dataset, None)
        self.last_piece_end = self.clock()
        if self.bar is not None:  # trials ASHA never started still count as done
            self.bar.update(max(0, self.planned[dataset] - self.trials[dataset]))
        self.trials[dataset] = self.planned[dataset]
        self.line(f"[{self.name}] {dataset}: " + (f"FAILED: {failed}" if failed else "done"))
        self._refresh()

    def tick(self) -> None:
        """In a log: the status line every interval_s."""
        if self.bar is None and self.clock() - self.last_status >= self.interval_s:
            self.last_status = self.clock()
            done = sum(self.trials.values())
            self.line(f"[{self.name}] progress: {done}/{self.total} trials, {self._eta(done)}; "
                      f"{self._summary()}")

    def _units_left(self, pace: float | None = None) -> float:
        """The plan's wall seconds left: the longest unit's rest (its trials and final seeds run
        one after another), or all units' rest over the lanes, whichever is longer. With `pace`
        (this run's seconds per planned second), a running unit's rest is less the time its
        current piece (the next trial, else the final seeds) has run, in planned seconds and up
        to that piece's planned length: a long trial in progress brings the ETA down, not up."""
        now, rests = self.clock(), []
        for d, (trial, final) in self.unit_costs.items():
            if d not in self.planned:
                continue
            trials_left = max(0, self.planned[d] - self.trials[d])
            rest = trials_left * trial + (0.0 if self.datasets[d] in ("done", "failed")
                                          else final)
            if pace is not None and d in self.piece_start:
                piece = trial if trials_left else final
                rest -= min((now - self.piece_start[d]) / pace, piece)
            rests.append(max(0.0, rest))
        return max(max(rests, default=0.0), sum(rests) / self.lanes)

    def _eta(self, done: int) -> str:
        """With the units' costs (the plan's), the plan's time left of the units still to run
        (a long unit left alone at the end is its own length, not the sweep's mean pace per
        trial), scaled by this run's speed against the plan up to its last finished trial,
        weighed by how much of the plan has passed, less what the running pieces have done;
        trials restored by --resume do not count. Without them, this run's pace per trial so
        far."""
        finished = done - self.start_done
        if self.unit_costs:
            passed = self.start_left - self._units_left()
            spent = self.last_piece_end - self.start
            speed = spent / passed if passed > 0 and spent > 0 else 1.0
            weight = passed / self.start_left if self.start_left else 1.0
            pace = (1 - weight) + weight * speed
            left = self._units_left(pace) * pace
        elif finished > 0:
            left = (self.clock() - self.start) / finished * (self.total - done)
        else:
            return "ETA -"
        return f"ETA {int(left // 60)} min {int(left % 60):02d} s"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        served, evaluated = self.cache
        if evaluated:  # once: how much of the evaluation the frozen-prefix cache served
            self.line(f"[{self.name}] prefix cache: served {served:,} of the {evaluated:,} "
                      f"images and prompts that evaluation passes encoded "
                      f"({served / evaluated:.0%})")
            self.cache = [0, 0]
