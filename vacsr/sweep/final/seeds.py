"""The selected config re-run on every seed, then its test evaluations (paper sec. 4.1: results
are averaged over three seeds).

Each final checkpoint is encoded on the first of the chunked evaluation actors (`EvalPool`),
which holds what a run's worker holds (the GPU encodes); the pairwise adapter scores (COCO 5K:
5,000 x 25,000 pairs; classification: images x classes) are computed by those actors, sharded
over `--eval-actors`. A seed's run of one worker trains in that first actor too
(vacsr/distributed/actor_run.py), as a one-worker trial trains in its Tune actor; a run of
several workers is a Ray Train TorchTrainer, the actors stopped while it holds the resources.
With one evaluation actor (the default) a checkpoint is encoded and scored in that actor, and only
its metrics come back: the dataset's task holds no features and imports no torch.
"""
from __future__ import annotations

import copy
import sys
from functools import partial
from pathlib import Path
from statistics import mean
from typing import Callable

from vacsr.distributed.pool_scorer import PoolScorer
from vacsr.records import TrackingCallback
from vacsr.records.sweep_records import place_child_run
from vacsr.sweep.plan.folders import FINAL, copy_from_storage, final_run_folder
from vacsr.sweep.plan.plan import SweepPlan, trains_in_trial
from vacsr.train.run_files import CHECKPOINT_FILE

REUSED_TAG = "vacsr.reused_trial"  # the seed's checkpoint is this trial's
RETRAINED_TAG = "vacsr.retrained"  # why the trial's checkpoint was not reused (damaged)


def final_config(best, plan: SweepPlan, dataset: str, seed: int, parent_run_id: str):
    config = copy.deepcopy(best)
    config.train.seed = seed
    config.train.output_dir = str(final_run_folder(plan.storage, dataset, seed))
    config.train.storage_path = plan.ray_path(FINAL)
    config.train.eval_test = False  # test is scored once, by the evaluation actors
    place_child_run(config, tracking_uri=plan.tracking_uri, experiment=plan.kind.experiment,
                    parent_run_id=parent_run_id, run_name=f"{dataset}-final-seed{seed}")
    return config


def test_metrics(plan: SweepPlan, config, checkpoint: Path, scorer: PoolScorer,
                 report: Callable[[dict], None] = lambda event: None,
                 ) -> tuple[dict[str, float], tuple[int, int]]:
    """The test split, then the kind's extra evaluations (novel classes, domain shifts), then
    the kind's per-seed averages; and (inputs the prefix cache served, inputs encoded). The
    cache's lines on damaged files it rebuilt go to `report` (the evaluation actor's log is
    not the console)."""
    test, *extra = scorer.evaluate(config, checkpoint, [(None, None), *(
        (evaluation.dataset, evaluation.classes) for evaluation in plan.kind.evaluations)])
    for line in (line for e in (test, *extra) for line in e.cache_rebuilt):
        report({"event": "note", "dataset": config.data.dataset,
                "text": f"final seed {config.train.seed}: prefix cache: {line}"})
    cache = (sum(e.cache_served for e in (test, *extra)),
             sum(e.cache_evaluated for e in (test, *extra)))
    metrics = dict(test.metrics)
    for evaluation, scored in zip(plan.kind.evaluations, extra):
        metrics[evaluation.metric] = scored.metrics[evaluation.key]
    for name, parts in plan.kind.averages.items():
        metrics[name] = mean(metrics[p] for p in parts)
    return metrics, cache


def _reuse_trial(plan: SweepPlan, config, best: dict, dataset: str,
                 checkpoint_error: Callable[[Path], str | None],
                 report: Callable[[dict], None]) -> tuple[Path | None, dict[str, str]]:
    """(the seed's final checkpoint, tags of its run). The best trial trained this very config on
    this seed to the end: its checkpoint is the seed's final one (runs are seeded, so a re-run
    would repeat it). When that checkpoint is damaged the seed is trained again: one line on the
    driver's console names the file, and the retrained run's RETRAINED_TAG says why.
    `checkpoint_error` (vacsr.train.checkpoint.checkpoint_problem) says what is wrong with the
    copy: in a sweep, the evaluation actor that will encode it loads it (this task imports no
    torch)."""
    copy = copy_from_storage(plan.ray_root, best["checkpoint"],
                             Path(config.train.output_dir) / CHECKPOINT_FILE)
    error = checkpoint_error(copy)
    if error is not None:
        copy.unlink()
        why = f"{best['checkpoint']}: {error.removeprefix(f'{copy}: ')}"  # the trial's file
        text = (f"{why}; final seed {config.train.seed} is trained again instead of reusing "
                f"trial {best['trial_id']}")
        print(f"vacsr: {text}", file=sys.stderr, flush=True)  # the dataset task's log
        report({"event": "note", "dataset": dataset, "text": text})
        return None, {RETRAINED_TAG: why}
    return copy, {REUSED_TAG: best["trial_id"]}


def _log_test(config, metrics: dict, tags: dict) -> None:
    """The pool-scored test metrics join the seed's MLflow run (the reused trial's checkpoint gets
    a run of its own). resume=True: a restarted driver continues the same run."""
    tracker = TrackingCallback.from_config(
        config, resume=True, tags={"vacsr.seed": config.train.seed, **tags}).tracker()
    tracker.log_epoch(config.train.epochs, {f"test/{k}": v for k, v in metrics.items()})
    tracker.finish()


def _train(scorer, config, name: str) -> tuple[Path, tuple[str, ...]]:
    """The seed's run: in the scorer's first actor when one worker trains it, else on Ray Train
    under `name` (a run started again under it resumes from its last checkpoint); (its final
    checkpoint, the prefix cache's lines on damaged files it rebuilt)."""
    if trains_in_trial(config.train) or scorer.trains_any_run:
        checkpoint, notes = scorer.train(config)
        return Path(checkpoint), notes
    # the evaluation actors' CPUs (or GPUs) are the run's: held across it, datasets finishing
    # at once on a full cluster each wait for the others' for ever
    from vacsr.distributed.train import fit_ray  # Ray Train's torch layer, for this run alone

    scorer.shutdown()
    trained = fit_ray(config, name=name)
    return trained.checkpoint, trained.notes


def _scorer(plan: SweepPlan, dataset: str):
    """The final phase's scorer: the sweep's evaluation actors, or a rehearsal's clock."""
    cpus = plan.configs[dataset].train.cpus_per_worker
    if plan.rehearse:
        from vacsr.sweep.rehearsal.finals import RehearsalScorer

        return RehearsalScorer(plan.clocks[dataset], cpus)
    return PoolScorer(plan.eval_actors, cpus)


def final_runs(plan: SweepPlan, dataset: str, best: dict, dataset_run_id: str,
               report: Callable[[dict], None] = lambda event: None) -> dict:
    """Every seed's test metrics (per_seed, in plan.seeds_of(dataset) order)."""
    cfg = best["config"]
    reused_seed = cfg.train.seed if best.get("checkpoint") else None
    scorer = _scorer(plan, dataset)
    per_seed, reused_trial = [], None
    try:
        for seed in plan.seeds_of(dataset):
            config = final_config(cfg, plan, dataset, seed, dataset_run_id)
            checkpoint, tags = (_reuse_trial(plan, config, best, dataset,
                                             partial(scorer.checkpoint_error, config), report)
                                if seed == reused_seed else (None, {}))
            reused_trial = tags.get(REUSED_TAG, reused_trial)
            if checkpoint is None:
                checkpoint, notes = _train(scorer, config, f"{dataset}-seed{seed}")
                for line in notes:
                    report({"event": "note", "dataset": dataset,
                            "text": f"final seed {seed}: prefix cache: {line}"})
            metrics, cache = test_metrics(plan, config, checkpoint, scorer, report)
            _log_test(config, metrics, {**tags, **plan.run_tags})
            per_seed.append({"seed": seed, **metrics})
            report({"event": "final", "dataset": dataset, "seed": seed, "metrics": metrics,
                    "cache": cache})
    finally:
        scorer.shutdown()
    return {"per_seed": per_seed, "reused_trial": reused_trial}

