"""The sweep command line: every bad input fails in one line before any trial starts, each flag
is parsed once, and the embedded profile is one file."""
from __future__ import annotations

import pytest

from conftest import built_plan, error_line, sweep_plan
from sweeps.base2novel import SWEEP as BASE2NOVEL
from sweeps.retrieval import SWEEP as RETRIEVAL
from vacsr.errors import ConfigError
from vacsr.sweep.plan import command_line as cli
from vacsr.sweep.plan.embedded_profile import load_profile
from vacsr.sweep.plan.flags import build_parser
from vacsr.sweep.spec.space import Int


def test_bad_input_fails_before_any_trial(tmp_path):
    with pytest.raises(ConfigError, match="unknown dataset 'mnist'"):
        sweep_plan(BASE2NOVEL, tmp_path, ["--datasets", "eurosat,mnist"])
    with pytest.raises(ConfigError, match="inverted"):
        sweep_plan(BASE2NOVEL, tmp_path,
                   ["--datasets", "eurosat", "--range", "loss.gamma=log:5:1"])
    with pytest.raises(ConfigError, match="127.0.0.1:9"):
        sweep_plan(BASE2NOVEL, tmp_path,
                   ["--datasets", "eurosat", "--tracking-uri", "http://127.0.0.1:9"])
    with pytest.raises(ConfigError, match="loss.gamma"):
        sweep_plan(BASE2NOVEL, tmp_path, ["--datasets", "eurosat", "--set", "loss.gamma=-1"],
                   data=tmp_path)
    assert not (tmp_path / "base2novel" / "tune").exists()  # nothing started
    assert not (tmp_path / "base2novel" / "data").exists()  # nor any data written


def test_bad_cluster_settings_fail_before_any_trial(tmp_path):
    base = ["--datasets", "eurosat"]
    with pytest.raises(ConfigError, match="--ray-storage 'nosuch://bucket'"):
        sweep_plan(BASE2NOVEL, tmp_path, base + ["--ray-storage", "nosuch://bucket"],
                   data=tmp_path)
    with pytest.raises(ConfigError, match="--optuna-storage"):
        sweep_plan(BASE2NOVEL, tmp_path,
                   base + ["--optuna-storage", "postgresql://u:secret@127.0.0.1:9/db"],
                   data=tmp_path)
    assert not (tmp_path / "base2novel" / "tune").exists()


@pytest.mark.parametrize("argv, fragment", [
    (["--datasets", ""], "--datasets: expected a value"),
    (["--trials", "0"], "--trials: expected a value > 0"),
    (["--seeds", ""], "--seeds: expected a value"),
    (["--parallel-datasets", "0"], "--parallel-datasets: expected a value > 0"),
    (["--trial-cpus", "0"], "--trial-cpus: expected a value > 0"),
    (["--epochs", "-1"], "--epochs: expected a value > 0"),
    (["--storage", ""], "--storage: expected a value"),
    # numpy takes seeds up to 2**32 - 1: a larger one failed inside every trial, after Ray
    (["--seeds", "1,x"], "--seeds: expected an integer, got 'x' (in '1,x')"),
    (["--seeds", "1,99999999999999999999"], "--seeds: expected a seed from 0 to 4294967295, got "
                                            "99999999999999999999 (in '1,99999999999999999999')"),
    (["--seeds", "-1"], "--seeds: expected a seed from 0 to 4294967295, got -1 (in '-1')"),
    (["--seed", "4294967296"], "--seed: expected a seed from 0 to 4294967295, got 4294967296"),
    (["--draw-slack", "-1"], "--draw-slack: expected an integer >= 0, got -1"),
    (["--device-memory-gib", "0"], "--device-memory-gib: expected a value > 0"),
    (["--plan-out", ""], "--plan-out: expected a value"),
])
def test_empty_zero_or_out_of_range_flags_are_errors_not_defaults(argv, fragment, capsys):
    with pytest.raises(SystemExit) as stop:
        build_parser(BASE2NOVEL).parse_args(argv)
    assert fragment in error_line(stop.value.code, capsys.readouterr().err)


def test_the_largest_seed_is_taken(tmp_path):
    args = build_parser(BASE2NOVEL).parse_args(["--seeds", "4294967295,0,0", "--seed",
                                                    "4294967295"])
    assert (args.seeds, args.seed) == ((4294967295, 0), 4294967295)


def test_cluster_settings_come_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("VACSR_SWEEP_STORAGE", "/shared/sweeps")
    monkeypatch.setenv("VACSR_RAY_STORAGE", "s3://bucket/vacsr")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    args = build_parser(BASE2NOVEL).parse_args([])
    assert (args.storage, args.ray_storage) == ("/shared/sweeps", "s3://bucket/vacsr")
    assert (args.tracking_uri, args.ray_address) == ("http://mlflow:5000", "http://head:8265")
    monkeypatch.setenv("RAY_ADDRESS", "")  # an empty variable is unset, not an address
    assert build_parser(BASE2NOVEL).parse_args([]).ray_address is None
    plan = sweep_plan(BASE2NOVEL, tmp_path,
                      ["--datasets", "eurosat", "--ray-storage", f"file://{tmp_path}/ray",
                       "--tracking-uri", f"sqlite:///{tmp_path}/m.db"], data=tmp_path)
    assert plan.ray_path("tune", "eurosat") == f"file://{tmp_path}/ray/tune/eurosat"
    assert plan.storage == tmp_path / "base2novel"


def test_the_local_instance_starts_its_dashboard_only_when_asked(tmp_path):
    plain = sweep_plan(BASE2NOVEL, tmp_path / "a", ["--datasets", "eurosat"], data=tmp_path)
    asked = sweep_plan(BASE2NOVEL, tmp_path / "b", ["--datasets", "eurosat", "--ray-dashboard"],
                       data=tmp_path)
    assert (plain.ray_dashboard, asked.ray_dashboard) == (False, True)


def test_every_value_is_parsed_once_and_configs_are_resolved_in_the_driver(tmp_path,
                                                                           monkeypatch):
    """--set texts go through parse_override exactly once each however many datasets use them;
    the trials get the resolved Config as an object and only suggested keys are searched."""
    from vacsr import config as cfg

    calls = []
    real = cfg.parse_override
    monkeypatch.setattr(cfg, "parse_override", lambda text: calls.append(text) or real(text))
    monkeypatch.setattr(cfg, "load_config", lambda *a, **k: pytest.fail("string re-parse"))
    sets = ["loss.beta=2.5", "adapter.hidden_dim=48"]
    plan = sweep_plan(BASE2NOVEL, tmp_path, ["--datasets", "eurosat,dtd,caltech101",
                                             *sum((["--set", s] for s in sets), [])],
                      data=tmp_path)
    assert calls == sets
    for dataset, config in plan.configs.items():
        assert (config.loss.beta, config.adapter.hidden_dim) == (2.5, 48)
        assert config.data.dataset == dataset and config.data.subsample_classes == "base"
        assert set(plan.spaces[dataset]) <= set(BASE2NOVEL.space) | {"train.batch_size"}


def test_the_embedded_profile_is_one_file_merged_per_kind(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "write_embedded_data", lambda *a: None)  # no data, no pretraining
    profile = load_profile(BASE2NOVEL)
    plan = sweep_plan(BASE2NOVEL, tmp_path, ["--datasets", "eurosat"])
    config = plan.configs["eurosat"]
    assert plan.trials == profile["trials"] and plan.seeds == tuple(profile["seeds"])
    assert config.data.shots == profile["shots"]
    assert config.adapter.hidden_dim == profile["set"]["adapter.hidden_dim"]
    assert config.model.pretrained == str(tmp_path / "base2novel" / "tiny-clip.pt")
    assert plan.spaces["eurosat"]["train.epochs"] == Int(4, 8)
    # the retrieval section: one epoch and no profile ranges (the paper's protocol lr)
    retrieval = sweep_plan(RETRIEVAL, tmp_path)
    assert retrieval.configs["coco"].train.epochs == 1
    assert "optim.lr" not in retrieval.spaces["coco"]  # C.2 fixes it, the profile keeps it
    assert retrieval.configs["coco"].optim.lr == RETRIEVAL.protocol["optim.lr"]
    # the user's flags win over the profile
    plan = sweep_plan(BASE2NOVEL, tmp_path, ["--datasets", "eurosat", "--trials", "5",
                                             "--shots", "3", "--set", "adapter.hidden_dim=32"])
    assert (plan.trials, plan.configs["eurosat"].data.shots) == (5, 3)
    assert plan.configs["eurosat"].adapter.hidden_dim == 32


def test_a_seed_run_records_its_test_metrics_once_across_driver_restarts(tmp_path):
    """The pool-scored test metrics join the seed's MLflow run; a restarted driver logging them
    again continues the same run instead of adding a second one."""
    from vacsr.config import load_config
    from vacsr.records import MlflowTracker
    from vacsr.sweep.final.seeds import _log_test, final_config

    plan = built_plan(BASE2NOVEL, tmp_path)
    uri = plan.tracking_uri
    parent = MlflowTracker(uri)
    parent_id = parent.start(BASE2NOVEL.experiment, "eurosat")
    config = final_config(load_config(overrides=["train.epochs=3"]), plan, "eurosat", 1,
                          parent_id)
    for _ in range(2):  # the second call is the restarted driver
        _log_test(config, {"acc": 42.0}, {"vacsr.reused_trial": "abc"})
    runs = parent.client.search_runs([parent.experiment_id(BASE2NOVEL.experiment)],
                                     filter_string="tags.`mlflow.runName` = 'eurosat-final-seed1'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.tags["vacsr.reused_trial"] == "abc"
    history = parent.client.get_metric_history(runs[0].info.run_id, "test/acc")
    assert [(m.step, m.value) for m in history] == [(3, 42.0)]





@pytest.mark.parametrize("damage", [b"", bytes(range(256)) * 4], ids=["empty", "garbage"])
def test_a_damaged_trial_checkpoint_is_said_and_the_retrained_seed_run_tagged(tmp_path, damage,
                                                                              capsys):
    """Final seed 1 reuses the selected trial's checkpoint; a zero-byte or garbage one is
    retrained: one console line names the trial's file, and the seed's run says why."""
    import io

    from vacsr.config import load_config
    from vacsr.records import MlflowTracker
    from vacsr.sweep.final.seeds import RETRAINED_TAG, _log_test, _reuse_trial, final_config
    from vacsr.sweep.report.progress import SweepProgress
    from vacsr.train.checkpoint import checkpoint_problem

    plan = built_plan(BASE2NOVEL, tmp_path)
    uri = plan.tracking_uri
    trial_checkpoint = plan.storage / "tune" / "eurosat" / "t1" / "checkpoint_2" / "last.ckpt"
    trial_checkpoint.parent.mkdir(parents=True)
    trial_checkpoint.write_bytes(damage)
    parent = MlflowTracker(uri)
    config = final_config(load_config(overrides=["train.epochs=3"]), plan, "eurosat", 1,
                          parent.start(BASE2NOVEL.experiment, "eurosat"))
    console = io.StringIO()
    progress = SweepProgress("t", ["eurosat"], 2, [], "val/acc", stream=console)
    # the check the evaluation actor makes in a sweep, made here
    checkpoint, tags = _reuse_trial(plan, config, {"checkpoint": str(trial_checkpoint),
                                                   "trial_id": "t1"}, "eurosat",
                                    checkpoint_problem, progress.event)
    assert checkpoint is None and not (plan.storage / "final" / "eurosat" / "seed1" /
                                       "last.ckpt").exists()  # no copy left to be mistaken
    [line] = [text for text in console.getvalue().splitlines() if "eurosat:" in text]
    assert line.startswith(f"[t] eurosat: {trial_checkpoint}: ") and "checkpoint" in line
    assert line.endswith("; final seed 1 is trained again instead of reusing trial t1")
    _log_test(config, {"acc": 42.0}, tags)
    [run] = parent.client.search_runs([parent.experiment_id(BASE2NOVEL.experiment)],
                                      filter_string="tags.`mlflow.runName` = "
                                                    "'eurosat-final-seed1'")
    assert run.data.tags[RETRAINED_TAG].startswith(f"{trial_checkpoint}: ")
    assert "vacsr.reused_trial" not in run.data.tags


def test_a_trial_the_local_instance_can_never_schedule_is_refused(tmp_path):
    """A local Ray has this machine's CPUs and no autoscaler: Ray would wait for such a trial
    forever, without a word."""
    import os

    cpus = os.cpu_count()
    with pytest.raises(ConfigError) as refused:
        sweep_plan(BASE2NOVEL, tmp_path / "store", ["--datasets", "eurosat",
                                                    "--cpus-per-worker", "100"],
                   data=tmp_path / "data")
    assert str(refused.value) == (
        f"--cpus-per-worker 100: one trial needs 100 CPUs (1 worker(s)), the local Ray instance "
        f"has {cpus} (this machine's); lower it, or join a cluster with --ray-address")
    with pytest.raises(ConfigError, match=f"one trial needs {cpus + 1} CPUs \\(2 worker"):
        sweep_plan(BASE2NOVEL, tmp_path / "store",
                   ["--datasets", "eurosat", "--workers", "2", "--trial-cpus", "1",
                    "--cpus-per-worker", f"{cpus / 2:g}", "--set", "train.batch_size=16"],
                   data=tmp_path / "data")
    assert not (tmp_path / "store").exists()
    sweep_plan(BASE2NOVEL, tmp_path / "store", ["--datasets", "eurosat", "--cpus-per-worker",
                                                str(cpus)], data=tmp_path / "data")  # fits
