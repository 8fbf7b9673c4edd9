"""What a full disk leaves in a Tune experiment folder is cleared before --resume restores it."""
from __future__ import annotations

import cloudpickle

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
