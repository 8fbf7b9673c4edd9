"""Sweep pieces that need no cluster: spaces, argument checks, val-only selection, storage."""
from pathlib import Path

import pytest

from conftest import built_plan, sweep_plan
from sweeps.base2novel import SWEEP as BASE2NOVEL
from vacsr.errors import ConfigError
from vacsr.sweep.search.selection import DatasetFailed, select_best
from vacsr.sweep.search.tune import sampler_seed
from vacsr.sweep.spec.paper import BASE_TO_NOVEL_BATCH_SIZES
from vacsr.sweep.spec.space import (
    Choice,
    Int,
    LogFloat,
    check_free_ranges,
    clamp_blocks,
    dataset_space,
    fixed_by,
    parse_range,
    start_point,
    tower_depths,
    validate_space,
)


def _space(dataset, overrides=None, workers=1, kind=BASE2NOVEL):
    return dataset_space(kind.space, kind.batch_sizes.get(dataset, ()), overrides, workers,
                         dataset)


def test_space_keys_are_config_keys_and_batch_sizes_follow_the_dataset():
    space = _space("eurosat")
    assert space["train.batch_size"] == Choice(BASE_TO_NOVEL_BATCH_SIZES["eurosat"])
    assert _space("sun397")["train.batch_size"].options[-1] == 128
    assert space["loss.alpha_kl"] == LogFloat(1e-5, 1e-2)
    assert space["adapter.num_components"] == Choice((1, 2, 3, 4))
    assert space["loss.num_hard_negatives"] == Choice((1, 2, 4, 8))
    with pytest.raises(ConfigError, match="loss.betta"):
        validate_space({"loss.betta": LogFloat(0.1, 1.0)})


@pytest.mark.parametrize("text, fragment", [
    ("loss.beta=log:2:1", "inverted"), ("loss.beta=log:1:1", "inverted"),
    ("train.epochs=int:5:2", "inverted"), ("adapter.num_components=choice:", "empty"),
    ("loss.beta=log:0:1", "low > 0"),
])
def test_empty_or_inverted_ranges_are_rejected(text, fragment):
    key, domain = parse_range(text)
    with pytest.raises(ConfigError, match=fragment):
        _space("dtd", {key: domain})


def test_a_fixed_key_leaves_the_space_of_every_dataset(tmp_path, monkeypatch, capsys):
    """--set on searched keys (a kind's, the embedded profile's, the batch size): the effective
    space lacks them, so no trial can draw another value, and the first trial does not stand
    out; the console names them once, with their values."""
    fixed = {"model.trainable_side": "last", "loss.beta": 0.5, "optim.lr": 0.002,
             "train.batch_size": 16}
    space = dataset_space(BASE2NOVEL.space, BASE_TO_NOVEL_BATCH_SIZES["eurosat"], workers=7,
                          fixed=fixed)  # a fixed batch size: no choices, none to refuse
    assert not set(fixed) & set(space) and "loss.gamma" in space
    # two datasets whose embedded training splits hold a batch of 16 (EuroSAT's 10 do not)
    argv = ["--datasets", "caltech101,dtd", *sum((["--set", f"{k}={v}"]
                                                   for k, v in fixed.items()), []),
            "--set", "adapter.hidden_dim=32"]
    plan = sweep_plan(BASE2NOVEL, tmp_path, argv, monkeypatch=monkeypatch)
    for dataset in ("caltech101", "dtd"):
        assert set(plan.spaces[dataset]) == set(_space(dataset)) - set(fixed)
        assert not set(fixed) & set(start_point(plan.spaces[dataset], plan.configs[dataset]))
        config = plan.configs[dataset]
        assert (config.model.trainable_side, config.loss.beta, config.optim.lr,
                config.train.batch_size) == ("last", 0.5, 0.002, 16)
    out = capsys.readouterr().out.splitlines()
    assert out == ["--set fixes searched keys: model.trainable_side=last, loss.beta=0.5, "
                   "optim.lr=0.002, train.batch_size=16; every trial and final run of every "
                   "dataset has their values"]  # adapter.hidden_dim is searched by no one


def test_epochs_fixes_the_searched_epochs_as_set_does(tmp_path, monkeypatch, capsys):
    """The embedded profile searches train.epochs (int:4:8); --epochs 3 fixes it like --set:
    no trial draws another count, and a second value or a range on it is one line."""
    plan = sweep_plan(BASE2NOVEL, tmp_path, ["--datasets", "eurosat", "--epochs", "3"],
                      monkeypatch=monkeypatch)
    assert "train.epochs" not in plan.spaces["eurosat"]
    assert plan.configs["eurosat"].train.epochs == 3
    assert capsys.readouterr().out.startswith("--set fixes searched keys: train.epochs=3;")
    with pytest.raises(ConfigError, match=r"^--epochs 3: --set train.epochs=5 gives another "
                                          r"value; give one$"):
        sweep_plan(BASE2NOVEL, tmp_path, ["--datasets", "eurosat", "--epochs", "3", "--set",
                                          "train.epochs=5"], monkeypatch=monkeypatch)
    with pytest.raises(ConfigError, match=r"^--range train.epochs: --set fixes it"):
        sweep_plan(BASE2NOVEL, tmp_path, ["--datasets", "eurosat", "--epochs", "3", "--range",
                                          "train.epochs=int:1:4"], monkeypatch=monkeypatch)


def test_a_range_on_a_fixed_key_is_refused():
    fixed = fixed_by({"optim.schedule": "cosine"}, {"loss.beta": 0.5}, "base2novel")
    check_free_ranges({"loss.gamma": LogFloat(0.5, 2.0)}, fixed)
    with pytest.raises(ConfigError, match=r"^--range loss.beta: --set fixes it, and a fixed key "
                                          r"is never searched; give one of the two$"):
        check_free_ranges({"loss.beta": LogFloat(0.5, 2.0)}, fixed)
    with pytest.raises(ConfigError, match=r"^--range optim.schedule: the base2novel protocol "
                                          r"fixes it \(paper appendix C.2\)"):
        check_free_ranges({"optim.schedule": Choice(("step",))}, fixed)
    # --set on a protocol key gives it another value, still fixed
    assert fixed_by({"optim.lr": 5e-4}, {"optim.lr": 1e-3}, "retrieval")["optim.lr"].startswith(
        "--set")


def test_parse_range_forms():
    assert parse_range("loss.beta=log:0.5:2") == ("loss.beta", LogFloat(0.5, 2.0))
    assert parse_range("train.epochs=int:1:3") == ("train.epochs", Int(1, 3))
    assert parse_range("adapter.num_components=choice:1,2") == ("adapter.num_components",
                                                               Choice((1, 2)))
    with pytest.raises(ConfigError, match="expected key=log"):
        parse_range("loss.beta=0.5")


def test_block_ranges_follow_the_backbone_depth_not_its_name():
    assert tower_depths("vacsr-tiny") == (3, 3) and tower_depths("ViT-B-32") == (12, 12)
    assert tower_depths("no-such-model") is None
    space = {"model.trainable_image_blocks": Int(0, 4), "model.trainable_text_blocks": Int(2, 8)}
    assert clamp_blocks(space, (3, 3)) == {"model.trainable_image_blocks": Int(0, 3),
                                           "model.trainable_text_blocks": Int(2, 3)}
    assert clamp_blocks(space, (12, 12)) == space
    assert clamp_blocks(space, None) == space


def test_selection_uses_val_metrics_only_and_skips_failed_trials():
    trials = [
        {"config": "a", "metrics": {"val/acc": 70.0, "test/acc": 95.0}},  # best test, not val
        {"config": "b", "metrics": {"val/acc": 80.0, "test/acc": 60.0}, "order": 1},
        {"config": "c", "metrics": {"val/acc": 80.0, "test/acc": 90.0}, "order": 2},  # ties b
        {"config": "d", "metrics": {"test/acc": 99.0}},  # never reported val
        {"config": "e", "metrics": {"val/acc": 99.0}, "error": "diverged"},  # failed after epoch 1
    ]
    assert select_best(trials, "val/acc")["config"] == "b"
    # the tie goes to the trial that started first, whatever order Tune lists them in
    assert select_best(trials[::-1], "val/acc")["config"] == "b"
    swapped = [dict(t, order={1: 2, 2: 1}[t["order"]]) if "order" in t else t for t in trials]
    assert select_best(swapped, "val/acc")["config"] == "c"
    assert select_best(trials, "val/acc", mode="min")["config"] == "a"
    with pytest.raises(ValueError, match="val metric"):
        select_best(trials, "test/acc")
    with pytest.raises(DatasetFailed, match=r"none of 2 trial\(s\) .* \(2 failed\): boom"):
        select_best([{"metrics": {"val/acc": 1.0}, "error": "boom"},
                     {"metrics": {}, "error": "boom"}], "val/acc")


def test_each_dataset_samples_from_its_own_seed():
    seeds = {sampler_seed(0, d) for d in BASE2NOVEL.datasets}
    assert len(seeds) == len(BASE2NOVEL.datasets)  # datasets do not start identically
    assert sampler_seed(0, "dtd") == sampler_seed(0, "dtd") != sampler_seed(1, "dtd")


def test_storage_paths_and_copies_for_paths_and_uris(tmp_path):
    from vacsr.sweep.plan.folders import copy_from_storage, join_storage

    assert join_storage("s3://b/p/", "tune", "x") == "s3://b/p/tune/x"
    assert join_storage(str(tmp_path), "tune") == str(tmp_path / "tune")
    source = tmp_path / "ray" / "ckpt" / "last.ckpt"
    source.parent.mkdir(parents=True)
    source.write_bytes(b"weights")
    for kind, root in (("path", str(tmp_path / "ray")), ("uri", f"file://{tmp_path}/ray")):
        dest = copy_from_storage(root, str(source), tmp_path / "out" / kind / "last.ckpt")
        assert dest.is_relative_to(tmp_path)
        assert dest.read_bytes() == b"weights" and not list(dest.parent.glob("*.tmp"))


@pytest.mark.parametrize("cpus,workers,cpw,trial_cpus,parallel,concurrent,expected", [
    (2, 1, 1.0, 1.0, None, 1, (2, 1)),   # one worker trains in the trial's actor: 1 CPU a trial
    (2, 1, 0.5, 0.1, None, 1, (4, 1)),   # the embedded default: four datasets side by side
    (64, 1, 4.0, 1.0, None, 1, (11, 1)),  # 16 slots over 11 datasets
    (64, 1, 1.0, 1.0, 4, 1, (4, 1)),     # a dataset's trials one after another: slots left idle
    (64, 1, 1.0, 1.0, 4, 16, (4, 16)),   # asked for: 4 datasets at once, 16 trials each
    (64, 1, 1.0, 1.0, None, 16, (4, 16)),  # 16 trials each: as many datasets as that leaves
    (8, 2, 1.0, 1.0, 20, 1, (2, 1)),     # 2 workers: the actor's CPU counts; never more datasets
    (3, 2, 1.0, 1.0, None, 1, (1, 1)),   # than slots (no starved trials)
    # without --concurrent-trials: the datasets the slots allow, then the slots divided
    (64, 1, 1.0, 1.0, None, None, (11, 5)),  # 11 datasets at once, 5 trials each: 55 of 64
    (64, 1, 1.0, 1.0, 4, None, (4, 16)),     # --parallel-datasets 4: 16 each
    (64, 1, 4.0, 1.0, None, None, (11, 1)),  # 16 slots: every dataset, a trial each
    (2, 1, 0.5, 0.1, None, None, (4, 1)),    # the embedded default's 4 slots
    (8, 2, 1.0, 1.0, None, None, (2, 1)),    # 2 workers, 3 CPUs a trial: 2 slots
])
def test_parallel_plan_never_oversubscribes(cpus, workers, cpw, trial_cpus, parallel, concurrent,
                                            expected):
    from vacsr.config import load_config
    from vacsr.sweep.plan.plan import sweep_parallelism

    config = load_config(overrides=[f"train.workers={workers}", f"train.cpus_per_worker={cpw}"])
    plan = built_plan(BASE2NOVEL, Path("/tmp"), configs={f"d{i}": config for i in range(11)},
                      spaces={f"d{i}": {"loss.beta": LogFloat(0.1, 10.0)} for i in range(11)},
                      parallel=parallel, trial_cpus=trial_cpus, concurrent_trials=concurrent)
    datasets_at_once, trials_each = sweep_parallelism(plan, {"CPU": cpus})
    assert (datasets_at_once, trials_each) == expected
    actor_cpus = 0 if workers == 1 else trial_cpus  # a one-worker trial's actor is its worker
    assert datasets_at_once * trials_each * (actor_cpus + workers * cpw) <= cpus


def test_more_trials_at_once_than_the_cluster_holds_is_refused_not_lowered():
    """--concurrent-trials decides the table: --plan and the sweep refuse one the cluster cannot
    hold, in one line, instead of planning or running fewer."""
    from vacsr.config import load_config
    from vacsr.errors import ConfigError
    from vacsr.sweep.plan.plan import sweep_parallelism

    config = load_config(overrides=["train.workers=2", "train.cpus_per_worker=1.0"])
    plan = built_plan(BASE2NOVEL, Path("/tmp"), configs={"d0": config},
                      spaces={"d0": {"loss.beta": LogFloat(0.1, 10.0)}}, trial_cpus=1.0,
                      concurrent_trials=4)
    with pytest.raises(ConfigError, match=r"^--concurrent-trials 4: this cluster holds 1 trials "
                                          r"at once, and the table depends on the number"):
        sweep_parallelism(plan, {"CPU": 3})


@pytest.mark.parametrize("condition, fragment", [
    (("adapter.kind", "coop"), "adapter.kind='coop', which the space does not draw"),
    (("train.epochs", 4), "train.epochs=4, which the space does not draw"),
    (("loss.neg_sigma_target", "nope"), "loss.neg_sigma_target='nope', which the space"),
])
def test_a_condition_on_a_key_the_space_does_not_draw_as_a_choice_is_refused(condition,
                                                                            fragment):
    space = {"loss.neg_sigma_target": Choice(("label", "positive")), "train.epochs": Int(4, 8),
             "loss.beta": LogFloat(0.1, 10.0, when=condition)}
    with pytest.raises(ConfigError, match=r"^search space loss\.beta: drawn when ") as info:
        validate_space(space)
    assert fragment in str(info.value)


def test_a_space_without_conditions_reads_as_it_was_recorded():
    """A sweep folder records its spaces as text and a --resume compares them: a domain with no
    condition reads as before conditions existed, so earlier sweeps resume."""
    assert repr(Choice((4, 8))) == "Choice(options=(4, 8))"
    assert repr(LogFloat(0.1, 10.0)) == "LogFloat(low=0.1, high=10.0)"
    assert repr(Int(1, 3, when=("k", 2))) == "Int(low=1, high=3, when=('k', 2))"


def test_the_first_trial_draws_a_conditional_key_only_where_its_condition_holds():
    from vacsr.config import load_config

    space = {"adapter.context_init": Choice(("random", "a photo of a")),
             "adapter.context_tokens": Choice((4, 8), when=("adapter.context_init", "random"))}
    phrase = load_config(overrides=["adapter.context_init=a photo of a"])
    assert start_point(space, phrase) == {"adapter.context_init": "a photo of a"}
    random = load_config(overrides=["adapter.context_init=random", "adapter.context_tokens=8"])
    assert start_point(space, random) == {"adapter.context_init": "random",
                                          "adapter.context_tokens": 8}


def test_the_first_trial_is_the_base_config_clamped_into_the_space():
    from vacsr.config import load_config

    base = load_config(overrides=["train.epochs=1", "optim.lr=5e-4"])
    space = _space("eurosat", {"train.epochs": Int(4, 8), "optim.lr": LogFloat(1e-3, 3e-3)})
    point = start_point(space, base)
    assert set(point) == set(space)
    # the paper's loss defaults (appendix E), untouched
    assert (point["loss.gamma"], point["loss.beta"], point["loss.alpha_kl"]) == (1.0, 1.0, 0.0005)
    assert point["adapter.num_components"] == 2 and point["loss.num_hard_negatives"] == 1
    assert point["loss.neg_sigma_target"] == "label"
    # values outside a range are clamped into it; a choice missing the value takes the first
    assert point["train.epochs"] == 4 and point["optim.lr"] == 1e-3
    assert point["model.trainable_image_blocks"] == 0  # -1 (all) -> the range's low end
    assert point["train.batch_size"] == 4  # 128 is not among eurosat's (4, 5, 6)


def test_a_trial_failed_by_a_stopped_driver_reports_to_a_fresh_optuna_trial_on_resume(tmp_path):
    """The stopped driver marks its RUNNING Optuna trials FAIL; when --resume continues the Tune
    trial (the searcher restored from its saved state), its results go to a new Optuna trial with
    the same values instead of failing the search (Optuna refuses to update a finished trial)."""
    import optuna

    from vacsr.sweep.search.optuna_searcher import OptunaStudySearch
    from vacsr.sweep.search.tune import fail_running_trials
    from vacsr.sweep.spec.space import DefineByRun

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    space = DefineByRun({"loss.beta": LogFloat(0.1, 10.0), "train.epochs": Int(1, 3)})
    search = OptunaStudySearch(space, metric="val/acc", mode="max", storage=storage,
                               study_name="s-eurosat", seed=0,
                               points_to_evaluate=[{"loss.beta": 1.0, "train.epochs": 2}])
    first = search.suggest("t1")
    assert first == {"loss": {"beta": 1.0}, "train": {"epochs": 2}}  # the start point, nested
    search.on_trial_result("t1", {"val/acc": 4.0, "training_iteration": 1})
    search.save(str(tmp_path / "searcher.pkl"))
    assert fail_running_trials(storage, "s-eurosat") == 1  # the driver stops

    resumed_search = OptunaStudySearch(space, metric="val/acc", mode="max", storage=storage,
                                       study_name="s-eurosat", seed=0)
    resumed_search.restore(str(tmp_path / "searcher.pkl"))
    resumed_search.on_trial_result("t1", {"val/acc": 5.0, "training_iteration": 2})
    resumed_search.on_trial_complete("t1", {"val/acc": 7.0, "training_iteration": 3})
    study = optuna.load_study(study_name="s-eurosat", storage=storage)
    failed, resumed = study.trials
    assert failed.state.name == "FAIL" and resumed.state.name == "COMPLETE"
    assert resumed.params == failed.params and resumed.value == 7.0
    assert failed.intermediate_values == {1: 4.0} and resumed.intermediate_values == {2: 5.0}
    resumed_search.on_trial_complete("t1", {"val/acc": 9.0})  # told once: a repeat is ignored
    assert [t.value for t in optuna.load_study(study_name="s-eurosat",
                                               storage=storage).trials] == [None, 7.0]


def test_a_trial_errored_on_an_outage_reports_to_a_fresh_optuna_trial_when_resumed(tmp_path):
    """A trial that errored on a tracking outage (or a full disk) is told FAIL; --resume continues
    it from its checkpoint (search/recovery.py), and its value must reach the study, or the
    resumed search samples from a study without it and its importance analysis counts none. Tune
    wraps the searcher in a ConcurrencyLimiter (max_concurrent_trials), restored on --resume
    without its running trials: the searcher holds the limit, so the limiter passes all on."""
    import optuna
    from ray.tune.search import ConcurrencyLimiter

    from vacsr.sweep.search.optuna_searcher import OptunaStudySearch
    from vacsr.sweep.spec.space import DefineByRun

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    space = DefineByRun({"loss.beta": LogFloat(0.1, 10.0)})

    def searcher() -> ConcurrencyLimiter:  # as Tune builds it
        return ConcurrencyLimiter(OptunaStudySearch(space, metric="val/acc", mode="max",
                                                    storage=storage, study_name="s", seed=0),
                                  max_concurrent=1)

    search = searcher()
    search.suggest("t1")
    assert search.suggest("t2") is None  # one at a time
    search.on_trial_result("t1", {"val/acc": 4.0, "training_iteration": 1})
    search.on_trial_complete("t1", error=True)  # the server stopped answering
    search.save(str(tmp_path / "searcher.pkl"))

    resumed_search = searcher()
    resumed_search.restore(str(tmp_path / "searcher.pkl"))
    resumed_search.on_trial_result("t1", {"val/acc": 5.0, "training_iteration": 2})
    resumed_search.on_trial_complete("t1", {"val/acc": 6.0, "training_iteration": 2})
    failed, resumed = optuna.load_study(study_name="s", storage=storage).trials
    assert (failed.state.name, resumed.state.name, resumed.value) == ("FAIL", "COMPLETE", 6.0)
    assert resumed.params == failed.params
    assert resumed.user_attrs == failed.user_attrs  # the same Tune trial, the same index
    assert resumed_search.suggest("t2") is not None  # the limit counts the ended trial out


def test_a_trial_told_before_the_stop_is_not_told_again_on_resume(tmp_path):
    """Tune saves its state (and the searcher's) now and then, so a stop can come after the
    study was told a trial's value but before Tune saved that the trial ended; --resume then
    runs the trial again. The study must keep one record of it: a second COMPLETE trial with the
    same parameters counts it twice in the sampler and in the importance analysis."""
    import optuna

    from vacsr.sweep.search.optuna_searcher import OptunaStudySearch
    from vacsr.sweep.spec.space import DefineByRun

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    space = DefineByRun({"loss.beta": LogFloat(0.1, 10.0)})

    def searcher(**start) -> OptunaStudySearch:
        return OptunaStudySearch(space, metric="val/acc", mode="max", storage=storage,
                                 study_name="s-eurosat", seed=0, **start)

    search = searcher(points_to_evaluate=[{"loss.beta": 1.0}])
    search.suggest("t1")
    search.suggest("t2")
    search.on_trial_result("t1", {"val/acc": 4.0, "training_iteration": 1})
    search.on_trial_result("t2", {"val/acc": 2.0, "training_iteration": 1})
    search.save(str(tmp_path / "searcher.pkl"))  # Tune's last save: both trials running
    search.on_trial_complete("t1", {"val/acc": 7.0, "training_iteration": 2})
    search.on_trial_complete("t2", {"training_iteration": 1})  # no metric: PRUNED at its last
    # the driver is killed here; nothing was RUNNING, so nothing is marked FAIL

    resumed = searcher()
    resumed.restore(str(tmp_path / "searcher.pkl"))
    resumed.on_trial_result("t1", {"val/acc": 6.0, "training_iteration": 2})  # run again
    resumed.on_trial_complete("t1", {"val/acc": 7.0, "training_iteration": 2})
    resumed.on_trial_complete("t2", {"val/acc": 3.0, "training_iteration": 2})
    trials = optuna.load_study(study_name="s-eurosat", storage=storage).trials
    assert [(t.state.name, t.value) for t in trials] == [("COMPLETE", 7.0), ("PRUNED", 2.0)]
    assert trials[0].intermediate_values == {1: 4.0}


def test_a_trial_lost_with_the_driver_is_created_again_the_same(tmp_path):
    """A stop between the searcher creating a trial and Tune saving it (the searcher's saved
    state with it): --resume restores a searcher that never created it, and Tune asks for a new
    trial in its place. The new one must be the lost one again (the base config, or the same
    draw), in its place of the creation order, and the draws after it those of a run that was
    not stopped."""
    import optuna

    from vacsr.sweep.search.optuna_searcher import OptunaStudySearch
    from vacsr.sweep.search.selection import creation_order
    from vacsr.sweep.search.tune import fail_running_trials
    from vacsr.sweep.spec.space import DefineByRun

    space = DefineByRun({"loss.beta": LogFloat(0.1, 10.0), "train.epochs": Int(1, 8)})
    start = [{"loss.beta": 1.0, "train.epochs": 2}]

    def searcher(storage, **points) -> OptunaStudySearch:
        return OptunaStudySearch(space, metric="val/acc", mode="max", storage=storage,
                                 study_name="s-dtd", seed=3, **points)

    def run(search, trial_id: str, value: float) -> dict:
        config = search.suggest(trial_id)
        search.on_trial_result(trial_id, {"val/acc": value, "training_iteration": 1})
        search.on_trial_complete(trial_id, {"val/acc": value, "training_iteration": 1})
        return config

    clean_storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'clean.db'}")
    clean = searcher(clean_storage, points_to_evaluate=start)
    expected = [run(clean, t, v) for t, v in (("c0", 5.0), ("c1", 6.0), ("c2", 7.0))]
    assert expected[0] == {"loss": {"beta": 1.0}, "train": {"epochs": 2}}

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'stopped.db'}")
    search = searcher(storage, points_to_evaluate=start)
    search.save(str(tmp_path / "before-t0.pkl"))  # Tune's save before the first trial
    assert search.suggest("t0") == expected[0]
    assert fail_running_trials(storage, "s-dtd") == 1  # the driver is killed; t0 is lost
    search = searcher(storage)  # --resume: Tune restores the saved searcher
    search.restore(str(tmp_path / "before-t0.pkl"))
    assert run(search, "t0b", 5.0) == expected[0]  # the base config again
    search.save(str(tmp_path / "after-t0b.pkl"))
    assert search.suggest("t1") == expected[1]
    assert fail_running_trials(storage, "s-dtd") == 1  # killed again; t1 is lost
    search = searcher(storage)
    search.restore(str(tmp_path / "after-t0b.pkl"))
    assert [run(search, t, v) for t, v in (("t1b", 6.0), ("t2", 7.0))] == expected[1:]
    assert creation_order(storage, "s-dtd") == {"t0": 0, "t0b": 0, "t1": 1, "t1b": 1, "t2": 2}
    assert creation_order(clean_storage, "s-dtd") == {"c0": 0, "c1": 1, "c2": 2}


def test_the_study_search_draws_the_same_configs_again_and_fails_errored_trials(tmp_path):
    import optuna

    from vacsr.sweep.search.optuna_searcher import OptunaStudySearch
    from vacsr.sweep.spec.space import DefineByRun

    space = DefineByRun({"loss.beta": LogFloat(0.1, 10.0), "train.epochs": Int(1, 3)})

    def draws(name: str) -> list[dict]:
        storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / name}")
        search = OptunaStudySearch(space, metric="val/acc", mode="max", storage=storage,
                                   study_name="s", seed=3)
        configs = [search.suggest(f"t{i}") for i in range(3)]
        search.on_trial_complete("t0", {"val/acc": 1.0})
        search.on_trial_complete("t1", None, error=True)
        search.on_trial_complete("t2", {"val/acc": float("nan")})
        states = [t.state.name for t in optuna.load_study(study_name="s", storage=storage).trials]
        assert states == ["COMPLETE", "FAIL", "FAIL"]
        return configs

    assert draws("a.db") == draws("b.db")


def test_a_tie_goes_to_the_trial_created_first_though_they_start_in_reverse(tmp_path):
    """Two trials end at one val value: the one the searcher created first (the enqueued base
    config, Optuna trial 0) is selected, although the other started, reported and finished
    first, and its id sorts first too. A trial resumed after a stop (a new Optuna trial with a
    higher number) keeps its first place."""
    import optuna

    from vacsr.sweep.search.optuna_searcher import OptunaStudySearch
    from vacsr.sweep.search.selection import creation_order
    from vacsr.sweep.search.tune import fail_running_trials
    from vacsr.sweep.spec.space import DefineByRun

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    space = DefineByRun({"loss.beta": LogFloat(0.1, 10.0)})
    search = OptunaStudySearch(space, metric="val/acc", mode="max", storage=storage,
                               study_name="s-dtd", seed=0, points_to_evaluate=[{"loss.beta": 1.0}])
    created = ["t_b", "t_a"]  # creation order; ids sort the other way
    configs = {tid: search.suggest(tid) for tid in created}
    assert configs["t_b"] == {"loss": {"beta": 1.0}}  # the base config, enqueued first
    # the second-created trial starts and finishes first, the first one is stopped mid-way
    search.on_trial_result("t_a", {"val/acc": 30.0, "training_iteration": 1})
    search.on_trial_complete("t_a", {"val/acc": 30.0})
    search.on_trial_result("t_b", {"val/acc": 10.0, "training_iteration": 1})
    assert fail_running_trials(storage, "s-dtd") == 1  # a driver stopped, t_b resumed
    search.on_trial_result("t_b", {"val/acc": 30.0, "training_iteration": 2})
    search.on_trial_complete("t_b", {"val/acc": 30.0})
    order = creation_order(storage, "s-dtd")
    assert order == {"t_b": 0, "t_a": 1}
    finished_first = [{"trial_id": tid, "metrics": {"val/acc": 30.0}, "order": order[tid]}
                      for tid in ("t_a", "t_b")]
    assert select_best(finished_first, "val/acc")["trial_id"] == "t_b"
    assert creation_order(storage, "no-such-study") == {}


def test_a_recorded_selection_is_read_back_and_a_damaged_one_refused(tmp_path):
    from vacsr.sweep.search.selection import read_selection, write_selection

    assert read_selection(tmp_path) is None
    record = {"trial_id": "t_b", "suggested": {"loss": {"beta": 1.0}}, "val": 30.0,
              "num_trials": 2, "failed_trials": 0, "checkpoint": None}
    write_selection(tmp_path, record)
    assert read_selection(tmp_path) == record
    for damaged in ("[]", "{", '{"trial_id": "t_b"}', '{"val": true}'):
        (tmp_path / "selection.json").write_text(damaged)
        with pytest.raises(ConfigError, match=r"selection.json: not a selection record"):
            read_selection(tmp_path)


def test_each_trial_run_records_the_value_selection_compared(tmp_path):
    """A trial ASHA stopped after epoch 1 may have logged epoch 2 before its workers stopped: its
    run gets the epoch-1 value selection used (selection_val/acc, vacsr.selection_epoch)."""
    from vacsr.records import MlflowTracker
    from vacsr.sweep.search.tune import record_selection_values

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowTracker(uri).client
    experiment = MlflowTracker(uri).experiment_id("vacsr-test")

    def run(name, parent=None):
        tags = {"mlflow.parentRunId": parent} if parent else {}
        return client.create_run(experiment, run_name=name, tags=tags).info.run_id

    parent = run("dtd")
    runs = {}
    for name, vals in (("a_0", [10.0, 20.0]), ("b_1", [30.0])):
        runs[name] = run(f"dtd-{name}", parent)
        for step, value in enumerate(vals, start=1):
            client.log_metric(runs[name], "val/acc", value, step=step)
    other = run("dtd-a_0", run("x"))  # the same name under another dataset run: not touched
    trials = [{"trial_id": "a_0", "metrics": {"val/acc": 10.0, "epoch": 1}},
              {"trial_id": "b_1", "metrics": {"val/acc": 30.0, "epoch": 1}},
              {"trial_id": "c_2", "metrics": {}, "error": "boom"}]
    assert record_selection_values(uri, "vacsr-test", parent, "dtd", trials, "val/acc") == 2
    a = client.get_run(runs["a_0"]).data
    assert a.metrics["selection_val/acc"] == 10.0 and a.metrics["val/acc"] == 20.0
    assert a.tags["vacsr.selection_epoch"] == "1"
    assert client.get_run(runs["b_1"]).data.metrics["selection_val/acc"] == 30.0
    assert "selection_val/acc" not in client.get_run(other).data.metrics


def test_the_base_to_novel_sweep_covers_the_eleven_datasets_by_default():
    """Table 5's 11 datasets, each with its protocol batch size: what `sweeps/base2novel.py`
    searches without --datasets (the e2e job test runs three of them)."""
    from vacsr.sweep.plan.command_line import _datasets

    expected = {"imagenet", "caltech101", "oxford_pets", "stanford_cars", "oxford_flowers",
                "food101", "fgvc_aircraft", "sun397", "dtd", "eurosat", "ucf101"}
    assert set(_datasets(BASE2NOVEL, None)) == expected == set(BASE2NOVEL.batch_sizes)
    assert _datasets(BASE2NOVEL, "eurosat, dtd") == ["eurosat", "dtd"]
