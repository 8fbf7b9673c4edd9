"""Where a trial trains and what it reserves: one worker in its Tune trial actor (with the
worker's resources), several as a TorchTrainer driven by a `trial_cpus` actor; a run's own error
is not trained again by Tune's retry, a storage error is."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from vacsr.config import load_config


@pytest.mark.parametrize("overrides, expected", [
    (["train.cpus_per_worker=0.5"], {"CPU": 0.5}),
    (["train.cpus_per_worker=2", "train.gpus_per_worker=0.5"], {"CPU": 2.0, "GPU": 0.5}),
    (["train.workers=2", "train.gpus_per_worker=1"], {"CPU": 0.1}),  # the workers reserve theirs
])
def test_a_trial_reserves_its_worker_where_it_trains_itself(overrides, expected):
    from vacsr.sweep.plan.plan import trains_in_trial, trial_resources

    train = load_config(overrides=overrides).train
    assert trial_resources(train, trial_cpus=0.1) == expected
    assert trains_in_trial(train) == (train.workers == 1)


def test_a_recorded_run_error_ends_the_retry_and_a_storage_error_does_not(tmp_path):
    from vacsr.sweep.search.trial_run import recorded_failure
    from vacsr.train.files import FAILED_FILE

    assert recorded_failure(tmp_path) is None  # a first attempt
    record = tmp_path / FAILED_FILE
    record.write_text(json.dumps({"error": "training diverged at epoch 1 (loss nan)",
                                  "type": "TrainingDiverged"}))
    assert recorded_failure(tmp_path) == "training diverged at epoch 1 (loss nan)"
    assert record.is_file()  # every retry ends the same way
    record.write_text(json.dumps({"error": "last.ckpt: no space left on the device",
                                  "type": "StorageError"}))
    assert recorded_failure(tmp_path) is None and not record.exists()  # retrained after a fix


def test_a_trial_that_trained_in_its_actor_gets_its_tune_checkpoint_path():
    from vacsr.sweep.search.tune import _with_checkpoint_path

    tune_stored = SimpleNamespace(metrics={"epoch": 3, "val/acc": 50.0},
                                  checkpoint=SimpleNamespace(path="/r/tune/eurosat/t1/ckpt_2"))
    assert _with_checkpoint_path(tune_stored)["checkpoint_path"] == "/r/tune/eurosat/t1/ckpt_2"
    train_stored = SimpleNamespace(metrics={"epoch": 3, "checkpoint_path": "/r/trials/t1/c"},
                                   checkpoint=None)  # TuneReportCallback's key wins
    assert _with_checkpoint_path(train_stored)["checkpoint_path"] == "/r/trials/t1/c"
    failed = SimpleNamespace(metrics=None, checkpoint=None)
    assert _with_checkpoint_path(failed) == {}


def test_a_damaged_reported_checkpoint_trains_the_run_again(tmp_path, capsys):
    """A zero-byte or garbage checkpoint where Ray restores a trial or a final seed run from:
    one line naming it, and the run starts from its first epoch (seeded: the same result)
    instead of failing the dataset."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    from vacsr.train.checkpoint import save_checkpoint
    from vacsr.distributed.ray_hooks import restore_reported

    class Reported:  # the part of ray.train.Checkpoint / tune.Checkpoint that is used
        def __init__(self, folder):
            self.folder = folder

        @contextmanager
        def as_directory(self):
            yield str(self.folder)

    loaded = []
    trainer = SimpleNamespace(device="cpu", load_state=loaded.append)
    assert restore_reported(trainer, None) is False
    for content in (b"", b"not a checkpoint"):
        (tmp_path / "last.ckpt").write_bytes(content)
        assert restore_reported(trainer, Reported(tmp_path)) is False
        [line] = capsys.readouterr().err.strip().splitlines()
        assert str(tmp_path / "last.ckpt") in line and "from its first epoch" in line
    assert loaded == []
    save_checkpoint(tmp_path / "last.ckpt", {"epoch": 2})
    assert restore_reported(trainer, Reported(tmp_path)) is True and loaded == [{"epoch": 2}]
