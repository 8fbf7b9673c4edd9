"""Where a trial trains and what it reserves: one worker in its Tune trial actor (with the
worker's resources), several as a TorchTrainer driven by a `trial_cpus` actor; a run's own error
is not trained again by Tune's retry, a storage error is."""
from __future__ import annotations

import json
from pathlib import Path
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
    from vacsr.train.run_files import FAILED_FILE

    assert recorded_failure(tmp_path) is None  # a first attempt
    record = tmp_path / FAILED_FILE
    record.write_text(json.dumps({"error": "training diverged at epoch 1 (loss nan)",
                                  "type": "TrainingDiverged"}))
    assert recorded_failure(tmp_path) == "training diverged at epoch 1 (loss nan)"
    assert record.is_file()  # every retry ends the same way
    record.write_text(json.dumps({"error": "last.ckpt: no space left on the device",
                                  "type": "StorageError"}))
    assert recorded_failure(tmp_path) is None and not record.exists()  # retrained after a fix


@pytest.mark.parametrize("content", [b"", b"\x00\x9f garbage", b'{"error": 7}', b"[1, 2]",
                                     b'{"type": "TrainingDiverged"}'])
def test_a_damaged_failure_record_is_one_line_to_both_of_its_readers(tmp_path, content):
    """The run's driver (after Ray Train returns) and a Tune retry of the trial (before it trains)
    read the record alike: damaged, it is the run's failure, naming the file, never a success
    nor a silent retrain."""
    from vacsr.errors import RunFailed
    from vacsr.sweep.search.trial_run import recorded_failure
    from vacsr.train.failure import raise_if_run_failed
    from vacsr.train.run_files import FAILED_FILE

    record = tmp_path / FAILED_FILE
    record.write_bytes(content)
    with pytest.raises(RunFailed) as raised:
        raise_if_run_failed(tmp_path)
    line = str(raised.value)
    assert line.startswith(f"{record}: a damaged failure record (") and "\n" not in line
    assert line.endswith("delete it to train the run again")
    assert recorded_failure(tmp_path) == line and record.read_bytes() == content


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


@pytest.mark.parametrize("atomic_storage", [True, False])
def test_a_damaged_reported_checkpoint_trains_the_run_again(tmp_path, capsys, atomic_storage):
    """A zero-byte or garbage checkpoint where Ray restores a trial or a final seed run from:
    one line naming it on Ray's storage, and the run starts from its first epoch (seeded: the
    same result) instead of failing the dataset. It is read from a copy of the process's own,
    never through `as_directory`'s temporary folder that a node's Train ranks share (a rank
    reading it while another downloads it again got a torn file, and the ranks, resuming from
    different epochs, waited for each other in DDP)."""
    import pyarrow.fs as pafs
    from ray.train import Checkpoint

    from vacsr.distributed.ray_hooks import restore_reported
    from vacsr.distributed.storage_fs import ray_storage
    from vacsr.train.checkpoint import save_checkpoint

    class Reported(Checkpoint):
        def as_directory(self):
            raise AssertionError("read through the node's shared temporary download")

    path, filesystem = ray_storage(str(tmp_path))
    filesystem = filesystem if atomic_storage else pafs.LocalFileSystem()
    reported = Reported(path=path, filesystem=filesystem)
    loaded = []
    trainer = SimpleNamespace(device="cpu", load_state=loaded.append, output_dir=tmp_path / "run")
    assert restore_reported(trainer, None) is False
    for content in (None, b"", b"not a checkpoint"):
        if content is not None:
            (tmp_path / "last.ckpt").write_bytes(content)
        assert restore_reported(trainer, reported) is False
        [line] = capsys.readouterr().err.strip().splitlines()
        assert f"{tmp_path / 'last.ckpt'}:" in line and "from its first epoch" in line
    assert loaded == []
    save_checkpoint(tmp_path / "last.ckpt", {"epoch": 2})
    assert restore_reported(trainer, reported) is True and loaded == [{"epoch": 2}]
    assert not (tmp_path / "run").exists() or list((tmp_path / "run").iterdir()) == []


def test_a_reported_checkpoint_is_written_in_the_run_folder_and_cleared_after(tmp_path):
    """The copy Ray takes each epoch's checkpoint from lives in the run's folder, not in /tmp:
    a process killed while it exists leaves it where the next start clears it."""
    from vacsr.distributed.ray_hooks import RayRun
    from vacsr.train.scratch import SCRATCH_PREFIX, clear_scratch

    sent = []

    class Run(RayRun):
        def send(self, metrics, folder):
            sent.append((metrics, sorted(p.name for p in Path(folder).iterdir())))
            assert Path(folder).parent == tmp_path / "run"  # where the run's files are

    trainer = SimpleNamespace(output_dir=tmp_path / "run", state=lambda epoch: {"epoch": epoch},
                              prefix_cache=None)
    Run().report(trainer, 3, {"val/acc": 1.0})
    assert sent == [({"val/acc": 1.0}, ["last.ckpt"])]
    # the prefix cache's line on a damaged file it rebuilt rides on the report, to the console
    from vacsr.model.prefix_cache import PrefixCache
    from vacsr.results import PREFIX_CACHE_REBUILT

    trainer.prefix_cache = PrefixCache(tmp_path / "cache")
    trainer.prefix_cache.stats.rebuilt.append("image-x.pt is damaged (zero bytes); rebuilt")
    Run().report(trainer, 4, {"val/acc": 1.0})
    assert sent[-1] == ({"val/acc": 1.0, PREFIX_CACHE_REBUILT: "image-x.pt is damaged (zero "
                                                               "bytes); rebuilt"}, ["last.ckpt"])
    assert list((tmp_path / "run").iterdir()) == []  # removed once Ray has its copy
    left = tmp_path / "final" / "eurosat" / "seed1" / f"{SCRATCH_PREFIX}x1"  # a killed worker's
    left.mkdir(parents=True)
    (left / "last.ckpt").write_bytes(b"partial")
    assert clear_scratch(tmp_path / "trials", tmp_path / "final") == [left]
    assert not left.exists() and left.parent.is_dir()
