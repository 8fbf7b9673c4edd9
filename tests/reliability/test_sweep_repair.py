"""What a full disk or a stopped driver leaves in a Tune experiment folder is repaired before
--resume restores it."""
from __future__ import annotations

from pathlib import Path

import cloudpickle
import pytest

from vacsr.sweep.search.recovery import repair_experiment


def _trial(folder, name, error_text):
    trial = folder / name
    trial.mkdir(parents=True)
    (trial / "result.json").write_text('{"epoch": 1}\n')
    (trial / "error.txt").write_text(error_text)
    (trial / "error.pkl").write_bytes(b"")  # the write that hit the full disk
    return trial


def test_empty_pickles_go_and_storage_errors_resume(tmp_path):
    full = _trial(tmp_path / "tune" / "eurosat", "run_trial_0",
                  "Failure # 1\nOSError: [Errno 28] No space left on device\n")
    (tmp_path / "tune" / "eurosat" / "basic-variant-state.json").write_bytes(b"")
    assert repair_experiment(str(tmp_path / "tune" / "eurosat")) is True
    assert not (full / "error.pkl").exists() and (full / "result.json").read_text()
    assert not (tmp_path / "tune" / "eurosat" / "basic-variant-state.json").exists()

    bad = _trial(tmp_path / "tune" / "dtd", "run_trial_0", "vacsr.errors.TrainingDiverged: ...")
    (bad / "kept.pkl").write_bytes(cloudpickle.dumps(1))
    assert repair_experiment(str(tmp_path / "tune" / "dtd")) is False  # a real error stays final
    assert (bad / "kept.pkl").stat().st_size > 0 and not (bad / "error.pkl").exists()
    assert repair_experiment("s3://bucket/tune/dtd") is False
    assert repair_experiment(str(tmp_path / "missing")) is False


def _counting_trial():
    """A trial function of steps 1..6, a checkpoint each (its step in last.ckpt), stopped by a full
    disk at the step the flag file names, as a sweep's trial is when the disk fills; nested, so
    that Ray's workers get it by value (they cannot import this module)."""

    def trial(config):
        import json
        import tempfile

        from ray import tune

        restored, start = tune.get_checkpoint(), 0
        if restored is not None and (Path(restored.path) / "last.ckpt").is_file():
            start = json.loads((Path(restored.path) / "last.ckpt").read_text())["step"]
        flag = Path(config["fail_flag"])
        for step in range(start + 1, 7):
            if flag.is_file() and step == int(flag.read_text()):
                raise OSError(28, "No space left on device")
            with tempfile.TemporaryDirectory() as folder:
                (Path(folder) / "last.ckpt").write_text(json.dumps({"step": step}))
                tune.report({"step": step, "started_at": start},
                            checkpoint=tune.Checkpoint.from_directory(folder))

    return trial


def _fit(folder, trainable, **config):
    """A new two-trial experiment in `folder`, or its restore (the sweep's resume of trials a
    full disk stopped); the restored tuner's repairs with its results."""
    from ray import tune

    from vacsr.sweep.search.recovery import restore_named_checkpoints

    if tune.Tuner.can_restore(folder):
        tuner = tune.Tuner.restore(str(folder), trainable=trainable, resume_errored=True)
        repaired = restore_named_checkpoints(tuner.get_results(), "last.ckpt")
    else:
        tuner = tune.Tuner(trainable, param_space={**config, "trial": tune.grid_search([0, 1])},
                           run_config=tune.RunConfig(
                               name=folder.name, storage_path=str(folder.parent), verbose=0,
                               checkpoint_config=tune.CheckpointConfig(num_to_keep=2)))
        repaired = []
    return tuner.fit(), repaired


@pytest.mark.ray
@pytest.mark.timeout(240)
def test_a_checkpoint_tune_deleted_after_its_last_saved_state_is_given_a_newer_one(
        ray_local, tmp_path):
    """Tune's saved state can name a checkpoint it deleted since (it rotates checkpoints as they
    come and saves its state now and then): the state of a first stop, put back after a second
    run went on, is what a driver SIGKILLed in between leaves. Each trial then resumes, from its
    newest whole checkpoint or, with none, from its start, instead of failing its restore."""
    folder, flag, trial = tmp_path / "tune" / "eurosat", tmp_path / "fail-at", _counting_trial()
    flag.write_text("3")
    first, _ = _fit(folder, trial, fail_flag=str(flag))
    assert [r.metrics["step"] for r in first] == [2, 2] and all(r.error for r in first)
    saved = {state.name: state.read_bytes() for state in folder.iterdir() if state.is_file()}
    flag.write_text("5")
    second, _ = _fit(folder, trial)
    assert [r.metrics["step"] for r in second] == [4, 4]
    trials = sorted(Path(r.path) for r in second)
    assert sorted(p.name for p in trials[0].glob("checkpoint_*")) == [
        "checkpoint_000002", "checkpoint_000003"]  # the state names checkpoint_000001
    (trials[1] / "checkpoint_000002" / "last.ckpt").unlink()  # half-written uploads
    (trials[1] / "checkpoint_000003" / "last.ckpt").unlink()
    for state in folder.iterdir():  # the first stop's state, as a SIGKILL leaves it
        if state.is_file():
            state.unlink()
    for name, content in saved.items():
        (folder / name).write_bytes(content)
    flag.unlink()

    third, repaired = _fit(folder, trial)
    assert [r.error for r in third] == [None, None]
    by_trial = {Path(r.path): r.metrics for r in third}
    assert by_trial[trials[0]]["step"] == 6 and by_trial[trials[0]]["started_at"] == 4
    assert by_trial[trials[1]]["step"] == 6 and by_trial[trials[1]]["started_at"] == 0
    assert sorted(repaired) == [
        f"{trials[0].name}: Tune's state names checkpoint_000001, which it had deleted; the "
        "trial resumes from checkpoint_000003",
        f"{trials[1].name}: Tune's state names checkpoint_000001, which it had deleted, and no "
        "newer checkpoint is whole; the trial trains again from its first epoch"]
