"""Sweep pieces that need no cluster: spaces, argument checks, val-only selection."""
from pathlib import Path

import pytest

from vacsr.errors import ConfigError
from vacsr.sweep.driver import select_best
from vacsr.sweep.space import (BATCH_SIZES, Choice, Int, LogFloat, parse_range, space_for,
                               validate_space)


def test_space_keys_are_config_keys_and_batch_sizes_follow_the_dataset():
    space = space_for("base2novel", "eurosat")
    assert space["train.batch_size"] == Choice(BATCH_SIZES["eurosat"])
    assert space_for("base2novel", "sun397")["train.batch_size"].options[-1] == 128
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
        space_for("base2novel", "dtd", {key: domain})


def test_parse_range_forms():
    assert parse_range("loss.beta=log:0.5:2") == ("loss.beta", LogFloat(0.5, 2.0))
    assert parse_range("train.epochs=int:1:3") == ("train.epochs", Int(1, 3))
    assert parse_range("adapter.num_components=choice:1,2") == ("adapter.num_components",
                                                               Choice((1, 2)))
    with pytest.raises(ConfigError, match="expected key=log"):
        parse_range("loss.beta=0.5")


def test_selection_uses_val_metrics_only():
    trials = [
        {"config": "a", "metrics": {"val/acc": 70.0, "test/acc": 95.0}},  # best test, not val
        {"config": "b", "metrics": {"val/acc": 80.0, "test/acc": 60.0}},
        {"config": "c", "metrics": {"val/acc": 80.0, "test/acc": 90.0}},  # ties b: later loses
        {"config": "d", "metrics": {"test/acc": 99.0}},  # never reported val
    ]
    assert select_best(trials, "val/acc")["config"] == "b"
    assert select_best(trials, "val/acc", mode="min")["config"] == "a"
    with pytest.raises(ValueError, match="val metric"):
        select_best(trials, "test/acc")


def _spec(argv, tmp_path):
    from vacsr.sweep.cli import build_parser, spec_from_args

    args = build_parser("base2novel").parse_args(argv + ["--storage", str(tmp_path)])
    return spec_from_args("base2novel", args)


def test_bad_input_fails_before_any_trial(tmp_path):
    with pytest.raises(ConfigError, match="unknown dataset 'mnist'"):
        _spec(["--datasets", "eurosat,mnist"], tmp_path)
    with pytest.raises(ConfigError, match="inverted"):
        _spec(["--datasets", "eurosat", "--range", "loss.gamma=log:5:1"], tmp_path)
    with pytest.raises(ConfigError, match="127.0.0.1:9"):
        _spec(["--datasets", "eurosat", "--tracking-uri", "http://127.0.0.1:9"], tmp_path)
    with pytest.raises(ConfigError, match="loss.gamma"):
        _spec(["--datasets", "eurosat", "--data-root", str(tmp_path), "--set", "loss.gamma=-1"],
              tmp_path)
    assert not (tmp_path / "base2novel" / "tune").exists()  # nothing started


def test_bad_cluster_settings_fail_before_any_trial(tmp_path):
    base = ["--datasets", "eurosat", "--data-root", str(tmp_path)]
    with pytest.raises(ConfigError, match="--ray-storage 'nosuch://bucket'"):
        _spec(base + ["--ray-storage", "nosuch://bucket"], tmp_path)
    with pytest.raises(ConfigError, match="--optuna-storage"):
        _spec(base + ["--optuna-storage", "postgresql://u:secret@127.0.0.1:9/db"], tmp_path)
    with pytest.raises(ConfigError, match="--trial-cpus"):
        _spec(base + ["--trial-cpus", "0"], tmp_path)
    assert not (tmp_path / "base2novel" / "tune").exists()


def test_cluster_settings_come_from_the_environment(tmp_path, monkeypatch):
    from vacsr.sweep.cli import build_parser

    monkeypatch.setenv("VACSR_SWEEP_STORAGE", "/shared/sweeps")
    monkeypatch.setenv("VACSR_RAY_STORAGE", "s3://bucket/vacsr")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    args = build_parser("base2novel").parse_args([])
    assert (args.storage, args.ray_storage) == ("/shared/sweeps", "s3://bucket/vacsr")
    assert (args.tracking_uri, args.ray_address) == ("http://mlflow:5000", "http://head:8265")
    spec = _spec(["--datasets", "eurosat", "--data-root", str(tmp_path),
                  "--ray-storage", f"file://{tmp_path}/ray", "--tracking-uri",
                  f"sqlite:///{tmp_path}/m.db"], tmp_path)
    assert spec.ray_path("tune", "eurosat") == f"file://{tmp_path}/ray/tune/eurosat"
    assert spec.storage == tmp_path / "base2novel"


def test_storage_paths_and_copies_for_paths_and_uris(tmp_path):
    from vacsr.sweep.driver import copy_from_storage, join_storage

    assert join_storage("s3://b/p/", "tune", "x") == "s3://b/p/tune/x"
    assert join_storage(str(tmp_path), "tune") == str(tmp_path / "tune")
    source = tmp_path / "ray" / "ckpt" / "last.ckpt"
    source.parent.mkdir(parents=True)
    source.write_bytes(b"weights")
    for root in (str(tmp_path / "ray"), f"file://{tmp_path}/ray"):
        dest = copy_from_storage(root, str(source), tmp_path / "out" / root[:4] / "last.ckpt")
        assert dest.read_bytes() == b"weights" and not list(dest.parent.glob("*.tmp"))


@pytest.mark.parametrize("cpus,workers,cpw,trial_cpus,parallel,expected", [
    (2, 1, 1.0, 1.0, 0, (1, 1)),      # 2 CPUs, a trial needs 2: one at a time
    (2, 1, 0.5, 0.1, 0, (3, 1)),      # the embedded default: three datasets side by side
    (64, 1, 4.0, 1.0, 0, (11, 1)),    # 12 slots over 11 datasets
    (64, 1, 1.0, 1.0, 4, (4, 8)),     # 32 slots, 4 datasets at once: 8 trials each
    (8, 2, 1.0, 1.0, 20, (2, 1)),     # never more datasets than slots (no starved trials)
])
def test_parallel_plan_never_oversubscribes(monkeypatch, cpus, workers, cpw, trial_cpus,
                                            parallel, expected):
    from vacsr.sweep import driver

    monkeypatch.setattr(driver.ray, "cluster_resources", lambda: {"CPU": cpus})
    spec = driver.SweepSpec(
        kind="base2novel", name="t", datasets=[f"d{i}" for i in range(11)],
        overrides={f"d{i}": [f"train.workers={workers}", f"train.cpus_per_worker={cpw}"]
                   for i in range(11)},
        metric="val/acc", storage=Path("/tmp"), tracking_uri="sqlite:///x.db",
        parallel=parallel, trial_cpus=trial_cpus)
    datasets_at_once, trials_each = driver.plan_parallelism(spec)
    assert (datasets_at_once, trials_each) == expected
    assert datasets_at_once * trials_each * (trial_cpus + workers * cpw) <= cpus


def test_reused_trial_checkpoint_is_one_final_run_across_driver_restarts(tmp_path, monkeypatch):
    """The best trial's checkpoint stands in for its seed's final run; evaluating it again after a
    driver restart continues the same MLflow run instead of adding a second one."""
    from vacsr.config import load_config
    from vacsr.sweep import run
    from vacsr.sweep.driver import SweepSpec
    from vacsr.tracking import MlflowTracker

    source = tmp_path / "ray" / "trials" / "eurosat" / "abc" / "checkpoint_0" / "last.ckpt"
    source.parent.mkdir(parents=True)
    source.write_bytes(b"trained weights")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = SweepSpec(kind="base2novel", name="t", datasets=["eurosat"], overrides={"eurosat": []},
                     metric="val/acc", storage=tmp_path / "sweep", tracking_uri=uri,
                     ray_storage=str(tmp_path / "ray"))
    parent = MlflowTracker(uri)
    parent_id = parent.start(spec.experiment, "eurosat")
    best = {"checkpoint": str(source), "trial_id": "abc"}
    evaluated = []

    class Evaluate:  # stands for the Ray task: records what it was given
        @staticmethod
        def remote(config, checkpoint):
            evaluated.append(Path(checkpoint).read_bytes())
            return {"acc": 42.0}

    monkeypatch.setattr(run.ray, "get", lambda ref: ref)
    config = run._final_config(load_config(overrides=["train.epochs=3"]), spec, "eurosat", 1,
                               parent_id)
    for _ in range(2):  # the second call is the restarted driver
        metrics, checkpoint = run._reuse_trial(spec, config, best, Evaluate)
        assert metrics == {"acc": 42.0} and checkpoint.read_bytes() == b"trained weights"
    assert evaluated == [b"trained weights"] * 2
    runs = parent.client.search_runs([parent.experiment_id(spec.experiment)],
                                     filter_string="tags.`mlflow.runName` = 'eurosat-final-seed1'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.tags["vacsr.reused_trial"] == "abc"
    history = parent.client.get_metric_history(runs[0].info.run_id, "test/acc")
    assert [(m.step, m.value) for m in history] == [(3, 42.0)]


def test_the_first_trial_is_the_base_config_clamped_into_the_space():
    from vacsr.config import load_config
    from vacsr.sweep.space import space_for, start_point

    base = load_config(overrides=["train.epochs=1", "optim.lr=5e-4"])
    space = space_for("base2novel", "eurosat", {"train.epochs": Int(4, 8),
                                                "optim.lr": LogFloat(1e-3, 3e-3)})
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
