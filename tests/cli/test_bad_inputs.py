"""Bad inputs end in one line `vacsr: error: ...`, exit status 2, and no half-written files.

Each case runs the real CLI entry point on tiny synthetic data and checks the line names the facts
a user needs to fix the run: sizes, the diverging loss part, the differing config key, the path.
"""
from __future__ import annotations

import errno
import hashlib
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vacsr.atomic import atomic_write, atomic_write_bytes
from vacsr.cli import main
from vacsr.config import load_config
from vacsr.data.sampler import GlobalBatchSampler
from vacsr.errors import ConfigError, StorageError, TrainingDiverged, VacsrError
from vacsr.train.checkpoint import save_checkpoint

TINY = ["data.num_train=8", "data.num_test=10", "train.batch_size=16", "train.epochs=1",
        "adapter.hidden_dim=16", "data.augment=false", "train.progress=false",
        "train.device=cpu"]


@pytest.fixture(scope="module")
def caltech_root(tmp_path_factory) -> Path:
    from vacsr.data.generate import generate_all

    return generate_all(tmp_path_factory.mktemp("data"), datasets=["caltech101"])


@pytest.fixture(scope="module")
def k2_checkpoint(tmp_path_factory, weights) -> Path:
    """A trained run's last.ckpt built with adapter.num_components=2 (the default)."""
    from vacsr.train.loop import Trainer

    out = tmp_path_factory.mktemp("k2") / "run"
    Trainer(load_config(overrides=[*TINY, f"model.pretrained={weights}",
                                   f"train.output_dir={out}"])).fit()
    return out / "last.ckpt"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _leftovers(folder: Path) -> list[Path]:
    """Checkpoints, eval outputs and temporary files a failed command must not leave."""
    if not folder.exists():
        return []
    return [p for p in folder.rglob("*")
            if p.name.endswith((".tmp", ".ckpt", ".json", ".png")) or p.name.startswith(".")]


def _run(argv: list[str], capsys) -> str:
    """main(argv) must return 2 and print exactly one `vacsr: error:` line; return that line."""
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert code == 2, captured
    assert len(lines) == 1 and lines[0].startswith("vacsr: error: "), lines
    return lines[0]


def _zero_steps(tmp, weights, caltech_root, k2):
    argv = ["train", f"model.pretrained={weights}", "data.task=classification",
            "data.dataset=caltech101", f"data.root={caltech_root}", "data.shots=1",
            "model.use_gpo=false", "train.batch_size=128", "train.progress=false",
            "train.device=cpu", f"train.output_dir={tmp / 'run'}"]
    return argv, ["caltech101", "50 images", "train.batch_size=128", "partial batch",
                  "train.batch_size <= 50", "data.shots"]


def _diverged(tmp, weights, caltech_root, k2):
    argv = ["train", *TINY, f"model.pretrained={weights}", "optim.lr=1e6", "data.num_train=16",
            f"train.output_dir={tmp / 'run'}"]
    return argv, ["training diverged at epoch 1 step 3/5", "non-finite loss parts", "recon=nan",
                  "lower optim.lr"]


def _diverged_in_last_update(tmp, weights, caltech_root, k2):
    # 2 steps: the loss stays finite, the last update is not; evaluation must not see it
    argv = ["train", *TINY, f"model.pretrained={weights}", "optim.lr=1e6",
            f"train.output_dir={tmp / 'run'}"]
    return argv, ["training diverged at epoch 1 step 2/2", "parameter", "non-finite",
                  "lower optim.lr"]


def _infinite_weight(tmp, weights, caltech_root, k2):
    argv = ["train", *TINY, "loss.beta=.inf", f"train.output_dir={tmp / 'run'}"]
    return argv, ["loss.beta", "finite", "inf"]


def _resume_other_architecture(tmp, weights, caltech_root, k2):
    (tmp / "run").mkdir()
    shutil.copy(k2, tmp / "run" / "last.ckpt")
    argv = ["train", *TINY, f"model.pretrained={weights}", "train.epochs=2",
            "adapter.num_components=3", f"train.output_dir={tmp / 'run'}"]
    return argv, [str(tmp / "run" / "last.ckpt"), "adapter.num_components=2",
                  "this config has 3", "train.resume=false"]


def _eval_other_architecture(tmp, weights, caltech_root, k2):
    shutil.copy(k2, tmp / "k2.ckpt")
    argv = ["eval", "--checkpoint", tmp / "k2.ckpt", "adapter.num_components=3",
            "adapter.hidden_dim=32"]
    return argv, [str(tmp / "k2.ckpt"), "adapter.num_components=2", "adapter.num_components=3",
                  "adapter.hidden_dim=16", "adapter.hidden_dim=32", "matching checkpoint"]


def _eval_without_stored_config(tmp, weights, caltech_root, k2):
    state = torch.load(k2, weights_only=True)
    del state["config"]
    torch.save(state, tmp / "bare.ckpt")
    argv = ["eval", "--checkpoint", tmp / "bare.ckpt", *TINY[:3], f"model.pretrained={weights}"]
    return argv, [str(tmp / "bare.ckpt"), "does not fit the model", "size mismatch for head."]


def _flag(*argv_and_facts):
    *argv, facts = argv_and_facts
    return lambda tmp, weights, caltech_root, k2: ([a.format(tmp=tmp) for a in argv], facts)


CASES = {
    "zero-step-epoch": _zero_steps,
    "non-finite-loss": _diverged,
    "non-finite-last-update": _diverged_in_last_update,
    "infinite-loss-weight": _infinite_weight,
    "resume-other-architecture": _resume_other_architecture,
    "eval-other-architecture": _eval_other_architecture,
    "eval-without-stored-config": _eval_without_stored_config,
    "infinite-lr": _flag("train", *TINY, "optim.lr=.inf", ["optim.lr", "finite", "inf"]),
    "workers-zero": _flag("train", "--workers", "0", ["--workers", ">= 1", "'0'"]),
    "config-empty": _flag("train", "--config", "", ["--config", "non-empty"]),
    "output-dir-empty": _flag("train", "train.output_dir=", ["train.output_dir", "non-empty"]),
    "root-empty": _flag("train", "data.root=", ["data.root", "null for the default"]),
    "eval-out-empty": _flag("eval", "--checkpoint", "{tmp}/x.ckpt", "--out", "",
                            ["--out", "non-empty"]),
    "two-stage-zero": _flag("eval", "--checkpoint", "{tmp}/x.ckpt", "--two-stage", "0",
                            ["--two-stage", ">= 1"]),
    "datasets-empty": _flag("generate-data", "--root", "{tmp}/d", "--datasets", "",
                            ["--datasets", "comma-separated names"]),
    "pretrain-too-few-images": _flag("pretrain-tiny", "--out", "{tmp}/w.pt", "--num-images",
                                     "3", ["num_images >= 26", "one batch of 128"]),
    "demo-epochs-zero": _flag("demo", "--workdir", "{tmp}/demo", "--epochs", "0",
                              ["--epochs", ">= 1"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_exit_2(case, tmp_path, capsys, weights, caltech_root,
                                          k2_checkpoint):
    before = _digest(k2_checkpoint)
    argv, facts = CASES[case](tmp_path, weights, caltech_root, k2_checkpoint)
    kept = {p: _digest(p) for p in tmp_path.rglob("*.ckpt")}  # inputs the command must not touch
    line = _run(argv, capsys)
    for fact in facts:
        assert fact in line, (fact, line)
    assert {p: _digest(p) for p in tmp_path.rglob("*.ckpt")} == kept, line
    assert [p for p in _leftovers(tmp_path) if p not in kept] == [], line
    assert _digest(k2_checkpoint) == before


def test_resume_mismatch_leaves_the_run_folder_as_it_was(tmp_path, capsys, k2_checkpoint,
                                                         weights):
    run = k2_checkpoint.parent
    config_before = (run / "config.yaml").read_text()
    _run(["train", *TINY, f"model.pretrained={weights}", "adapter.num_components=3",
          f"train.output_dir={run}"], capsys)
    assert (run / "config.yaml").read_text() == config_before  # still the checkpoint's config


def test_divergence_in_a_real_process_prints_one_line(tmp_path, weights):
    """The whole stderr of `python -m vacsr.cli` (no traceback, no warnings), not only main's."""
    out = subprocess.run([sys.executable, "-m", "vacsr.cli", "train", *TINY,
                          f"model.pretrained={weights}", "optim.lr=1e6",
                          f"train.output_dir={tmp_path / 'run'}"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vacsr: error: training diverged"), lines
    assert not (tmp_path / "run" / "last.ckpt").exists()


def test_full_disk_during_training_names_the_checkpoint(tmp_path, capsys, weights, monkeypatch):
    def full_disk(obj, target, *args, **kwargs):
        Path(target).write_bytes(b"partial")  # torch has begun writing when the disk fills
        raise RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos 123 vs "
                           "456") from OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    run = tmp_path / "run"
    line = _run(["train", *TINY, f"model.pretrained={weights}", f"train.output_dir={run}"],
                capsys)
    assert f"{run / 'last.ckpt'}: cannot write (no space left on the device)" in line
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]


# ---------------------------------------------------------------- the pieces behind the lines
def test_atomic_write_on_a_full_disk_keeps_the_previous_file(tmp_path):
    target = atomic_write_bytes(tmp_path / "state.bin", b"previous")

    def writer(tmp: Path) -> None:
        tmp.write_bytes(b"half of the new")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(StorageError, match="no space left") as info:
        atomic_write(target, writer)
    assert str(target) in str(info.value) and "\n" not in str(info.value)
    assert target.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.bin"]


def test_save_checkpoint_turns_torchs_full_disk_error_into_storage_error(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "last.ckpt", {"epoch": 1, "w": torch.ones(2)})
    before = path.read_bytes()

    def full_disk(obj, target, *args, **kwargs):
        Path(target).write_bytes(b"partial")
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos 123 "
                               "vs 456") from exc

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(StorageError) as info:
        save_checkpoint(path, {"epoch": 2, "w": torch.zeros(2)})
    assert str(path) in str(info.value)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_saved_files_keep_the_usual_permissions(tmp_path):
    """Temporary files start as 0600; results must not stay unreadable to the group."""
    import os

    umask = os.umask(0o022)
    os.umask(umask)
    path = save_checkpoint(tmp_path / "c.ckpt", {"w": torch.ones(1)})
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_training_diverged_is_its_own_picklable_class():
    """A sweep recognises a deterministic failure by class, also after Ray ships it back."""
    error = TrainingDiverged("training diverged at epoch 1 step 3/10")
    assert isinstance(error, VacsrError) and not isinstance(error, ConfigError)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is TrainingDiverged and str(again) == str(error)


def test_sampler_drops_the_last_partial_batch():
    sampler = GlobalBatchSampler(50, global_batch=16, seed=0)
    batches = list(sampler)
    assert len(sampler) == len(batches) == 3 and all(len(b) == 16 for b in batches)
    assert len(GlobalBatchSampler(50, global_batch=128)) == 0  # what the Trainer refuses


def test_other_settings_into_a_finished_run_folder_are_refused(tmp_path, capsys, k2_checkpoint,
                                                               weights):
    """Training keys that differ from the finished run's are named; the folder stays as it was;
    an evaluation-only change continues the run and says so."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(k2_checkpoint, run / "last.ckpt")
    shutil.copy(k2_checkpoint.parent / "config.yaml", run / "config.yaml")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    line = _run(["train", *TINY, f"model.pretrained={weights}", "optim.lr=0.3", "loss.gamma=5",
                 "train.seed=7", f"train.output_dir={run}"], capsys)
    for part in (str(run / "last.ckpt"), "trained with other settings", "loss.gamma=1.0 (this "
                 "config has 5.0)", "optim.lr=", "train.seed=1 (this config has 7)",
                 "train.resume=false"):
        assert part in line, line
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert main([*map(str, ["train", *TINY, f"model.pretrained={weights}", "train.eval_every=2",
                            f"train.output_dir={run}"])]) == 0
    assert "evaluation-only settings: train.eval_every=1 (this config has 2)" in \
        capsys.readouterr().err
