"""Bad inputs to the `vacsr` commands and to their config, each refused before any work or at
the step that meets it: exit status 2, one `vacsr: error:` line naming what a user needs to fix
the run (the file or value, sizes, the diverging loss part, the differing config key), and
nothing written or half-written. Each case runs the real entry point on tiny synthetic data. Also
the pieces behind those lines (atomic writes on a full disk, the errors a sweep recognises), the
ownership of a run folder (two `vacsr train` into one folder) and of a new MLflow store (two
processes creating it).

Inputs that made the old code exhaust memory run in a subprocess whose address space is capped,
so that such a failure stays a MemoryError of that process.
"""
from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import os
import pickle
import random
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from conftest import nothing_written, one_line, refused
from tests.support.servers import http_serving, responding
from vacsr.atomic import atomic_write, atomic_write_bytes
from vacsr.cli import main
from vacsr.config import load_config
from vacsr.data.sampler import GlobalBatchSampler
from vacsr.errors import ConfigError, StorageError, TrainingDiverged, VacsrError
from vacsr.train.checkpoint import save_checkpoint

TINY = ["data.num_train=8", "data.num_test=10", "train.batch_size=16", "train.epochs=1",
        "adapter.hidden_dim=16", "data.augment=false", "train.progress=false",
        "train.device=cpu"]
MEMORY_CAP = 4 << 30  # address space of a capped subprocess: torch imports in it
# nine levels of nine aliases: 9**9 entries once expanded, from 300 bytes of text
ALIAS_BOMB = "[&a [" + ", ".join(['"lol"'] * 9) + "]" + "".join(
    f", &{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi")) + "]"


def _cli(argv, *, cwd: Path | None = None, cap_memory: bool = False, timeout: float = 300,
         **popen) -> subprocess.CompletedProcess:
    """`python -m vacsr.cli ARGV` of the tree under test (the one pytest runs in)."""
    limit = (lambda: resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
             ) if cap_memory else None
    return subprocess.run([sys.executable, "-m", "vacsr.cli", *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          preexec_fn=limit, env={**os.environ, "PYTHONPATH": os.getcwd()},
                          **popen)


@pytest.fixture
def no_model_built(monkeypatch):
    """A command must be refused before a Trainer builds the model or generates data."""
    from vacsr.train import loop

    def built(*args, **kwargs):
        raise AssertionError("the model was built before the input was checked")

    monkeypatch.setattr(loop.Trainer, "__init__", built)


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


# ---------------------------------------------------------------- A: config text
@pytest.mark.parametrize("where", ["override", "config-file"])
def test_yaml_alias_bomb_is_one_line(tmp_path, where):
    config = tmp_path / "bomb.yaml"
    config.write_text(f"loss:\n  gamma: {ALIAS_BOMB}\n")
    given = [f"loss.gamma={ALIAS_BOMB}"] if where == "override" else ["--config", config]
    line = refused(_cli(["train", *given, f"train.output_dir={tmp_path / 'run'}"],
                        cap_memory=True))
    assert "YAML alias *a" in line and "no anchors or aliases" in line, line
    assert (f"{config}: holds" in line) if where == "config-file" else "loss.gamma=" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bomb.yaml"]


def test_deeply_nested_override_is_one_line(tmp_path, capsys):
    nested = "[" * 5000 + "]" * 5000
    line = one_line(["train", f"optim.decay_epochs={nested}",
                     f"train.output_dir={tmp_path / 'run'}"], capsys)
    assert "override 'optim.decay_epochs=[[[" in line and "nested deeper than 16" in line
    assert len(line) < 400 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("seed", ["99999999999999999999", "-1", "4294967296"])
def test_a_seed_out_of_every_librarys_range_is_one_line(tmp_path, capsys, seed):
    """numpy seeds from 0 to 2**32 - 1: a larger seed failed in the run (or every trial)."""
    line = one_line(["train", f"train.seed={seed}", f"train.output_dir={tmp_path / 'run'}"],
                    capsys)
    assert line == f"vacsr: error: train.seed: expected 0 to 4294967295, got {seed}"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content", [bytes(random.Random(0).randrange(256) for _ in range(200)),
                                     "train:\n  epochs: 1\n".encode("utf-16")],
                         ids=["random-bytes", "utf-16"])
def test_config_file_that_is_not_utf8_text(tmp_path, capsys, content):
    path = tmp_path / "overrides.yaml"
    path.write_bytes(content)
    line = one_line(["train", "--config", path, f"train.output_dir={tmp_path / 'run'}"], capsys)
    assert f"{path}: not UTF-8 text" in line and "expected a YAML file" in line
    nothing_written(tmp_path / "run")


# ---------------------------------------------------------------- B: the run folder
@pytest.mark.parametrize("kind", ["file", "dev-null", "below-a-file"])
def test_output_dir_that_is_no_folder(tmp_path, capsys, weights, no_model_built, kind):
    (tmp_path / "taken").write_text("a file\n")
    out = {"file": tmp_path / "taken", "dev-null": Path("/dev/null"),
           "below-a-file": tmp_path / "taken" / "run"}[kind]
    line = one_line(["train", *TINY, f"model.pretrained={weights}",
                     f"train.output_dir={out}"], capsys)
    assert line.startswith(f"vacsr: error: {out}: ") and "expected a folder for the run" in line
    assert ("a character device" if kind == "dev-null" else f"{tmp_path / 'taken'} is a file"
            if kind == "below-a-file" else "is a file") in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    assert (tmp_path / "taken").read_text() == "a file\n"


@pytest.mark.parametrize("inside", [False, True], ids=["read-only-folder", "missing-below-it"])
def test_read_only_output_dir(tmp_path, capsys, weights, read_only, no_model_built, inside):
    (tmp_path / "ro").mkdir()
    folder = read_only(tmp_path / "ro")
    out = folder / "run" if inside else folder
    line = one_line(["train", *TINY, f"model.pretrained={weights}",
                     f"train.output_dir={out}"], capsys)
    assert f"{out}: cannot write (" in line and "expected a writable folder for the run" in line
    assert list(folder.iterdir()) == []


# ---------------------------------------------------------------- C: synthetic sizes
@pytest.mark.parametrize("key", ["data.num_train", "data.num_test"])
def test_huge_synthetic_split_is_refused_at_validation(tmp_path, key):
    line = refused(_cli(["train", "data.image_size=1024", f"{key}=1000000", "train.device=cpu",
                         f"train.output_dir={tmp_path / 'run'}"], cap_memory=True))
    assert f"{key}: expected 1 to 682 images of 1024x1024 pixels" in line
    assert "got 1000000" in line and list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- D: data, loss, a continued run
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
    line = one_line(argv, capsys)
    for fact in facts:
        assert fact in line, (fact, line)
    assert {p: _digest(p) for p in tmp_path.rglob("*.ckpt")} == kept, line
    assert [p for p in _leftovers(tmp_path) if p not in kept] == [], line
    assert _digest(k2_checkpoint) == before


def test_resume_mismatch_leaves_the_run_folder_as_it_was(tmp_path, capsys, k2_checkpoint,
                                                         weights):
    run = k2_checkpoint.parent
    config_before = (run / "config.yaml").read_text()
    one_line(["train", *TINY, f"model.pretrained={weights}", "adapter.num_components=3",
              f"train.output_dir={run}"], capsys)
    assert (run / "config.yaml").read_text() == config_before  # still the checkpoint's config


def test_divergence_in_a_real_process_prints_one_line(tmp_path, weights):
    """The whole stderr of `python -m vacsr.cli` (no traceback, no warnings), not only main's."""
    out = subprocess.run([sys.executable, "-m", "vacsr.cli", "train", *TINY,
                          f"model.pretrained={weights}", "optim.lr=1e6",
                          f"train.output_dir={tmp_path / 'run'}"],
                         capture_output=True, text=True, timeout=300)
    assert refused(out).startswith("vacsr: error: training diverged")
    assert not (tmp_path / "run" / "last.ckpt").exists()


def test_full_disk_during_training_names_the_checkpoint(tmp_path, capsys, weights, monkeypatch):
    def full_disk(obj, target, *args, **kwargs):
        Path(target).write_bytes(b"partial")  # torch has begun writing when the disk fills
        raise RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos 123 vs "
                           "456") from OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    run = tmp_path / "run"
    line = one_line(["train", *TINY, f"model.pretrained={weights}", f"train.output_dir={run}"],
                    capsys)
    assert f"{run / 'last.ckpt'}: cannot write (no space left on the device)" in line
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]


def test_other_settings_into_a_finished_run_folder_are_refused(tmp_path, capsys, k2_checkpoint,
                                                               weights):
    """Training keys that differ from the finished run's are named; the folder stays as it was;
    an evaluation-only change continues the run and says so."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(k2_checkpoint, run / "last.ckpt")
    shutil.copy(k2_checkpoint.parent / "config.yaml", run / "config.yaml")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    line = one_line(["train", *TINY, f"model.pretrained={weights}", "optim.lr=0.3", "loss.gamma=5",
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


# ---------------------------------------------------------------- E: weights and checkpoint files
class _RunsCode:
    def __reduce__(self):
        return os.system, ("true",)


@pytest.mark.parametrize("kind", ["random-bytes", "yaml", "pickle-with-code"])
def test_pretrained_file_that_is_not_weights(tmp_path, capsys, kind):
    path = tmp_path / "weights.pt"
    if kind == "random-bytes":
        path.write_bytes(bytes(random.Random(1).randrange(256) for _ in range(300)))
    elif kind == "yaml":
        path.write_text("model:\n  name: vacsr-tiny\n")
    else:
        torch.save({"visual": _RunsCode()}, path)
    line = one_line(["train", f"model.pretrained={path}", "train.device=cpu",
                     f"train.output_dir={tmp_path / 'run'}"], capsys)
    assert f"model.pretrained: {path} is not vacsr-tiny weights" in line
    nothing_written(tmp_path / "run")


def test_checkpoint_whose_payload_is_a_list(tmp_path, capsys):
    torch.save([1, 2], tmp_path / "list.ckpt")
    line = one_line(["eval", "--checkpoint", tmp_path / "list.ckpt"], capsys)
    assert f"{tmp_path / 'list.ckpt'}: holds a list, not a vacsr checkpoint" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["list.ckpt"]


def test_eval_checkpoint_whose_model_entry_is_a_list(tmp_path, capsys, no_model_built):
    torch.save({"model": [1, 2], "epoch": 0}, tmp_path / "list.ckpt")
    line = one_line(["eval", "--checkpoint", tmp_path / "list.ckpt", *TINY[:3]], capsys)
    assert f"{tmp_path / 'list.ckpt'}: its 'model' entry holds a list, expected a state dict" \
        in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["list.ckpt"]


def test_eval_of_another_shape_without_its_config_is_one_line_in_a_process(tmp_path):
    """The whole stderr: open_clip's notice that the backbone starts random (its weights come
    from the checkpoint) is no second line."""
    from vacsr.config import load_config
    from vacsr.methods.build import build_model

    model = build_model(load_config(overrides=[*TINY, "adapter.hidden_dim=24"]))
    torch.save({"model": model.state_dict()}, tmp_path / "bare.ckpt")
    line = refused(_cli(["eval", "--checkpoint", tmp_path / "bare.ckpt", *TINY]))
    assert f"{tmp_path / 'bare.ckpt'}: does not fit the model of this config" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare.ckpt"]


# ---------------------------------------------------------------- F: the pieces behind the lines
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


def _not_a_file(path: Path, kind: str) -> str:
    """Make `path` a `kind` of non-regular file (real: mknod, mkfifo, mkdir); what the refusal
    calls it."""
    if kind in ("null", "full"):
        if os.geteuid() != 0:
            pytest.skip("mknod of a character device needs root")
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3 if kind == "null" else 7))
        return "a character device"
    if kind == "fifo":
        os.mkfifo(path)
        return "a named pipe"
    path.mkdir()
    (path / "kept").write_text("kept")
    return "a folder"


@pytest.mark.parametrize("kind", ["null", "full", "fifo", "folder"])
@pytest.mark.parametrize("writer", ["atomic_write", "ray_storage"])
def test_a_whole_file_write_onto_a_device_fifo_or_folder_is_refused_untouched(tmp_path, kind,
                                                                              writer):
    """A rename onto a copy of /dev/null would replace the device node by a regular file: vacsr's
    writer and the filesystem it gives Ray both refuse, in one line, before writing anything."""
    from vacsr.distributed.storage_fs import ray_storage

    target = tmp_path / "target"
    what = _not_a_file(target, kind)
    before = os.lstat(target)
    with pytest.raises(StorageError) as info:
        if writer == "atomic_write":
            atomic_write_bytes(target, b"payload")
        else:
            _, filesystem = ray_storage(str(tmp_path))
            with filesystem.open_output_stream(str(target)) as stream:
                stream.write(b"payload")
    assert str(info.value) == (f"{target}: cannot write (it is {what}); expected a path to a "
                               "regular file or to none yet")
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino,
                                                              before.st_rdev)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]  # no temporary file
    assert kind != "folder" or (target / "kept").read_text() == "kept"


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


# ---------------------------------------------------------------- G: folders that cannot be written
@contextlib.contextmanager
def _read_only(path: Path):
    """`path` made unwritable: chmod for a user, the immutable attribute for root (for whom
    permission bits mean nothing); skips where neither works."""
    path.chmod(0o555 if path.is_dir() else 0o444)
    immutable = os.geteuid() == 0 and subprocess.run(
        ["chattr", "+i", str(path)], capture_output=True).returncode == 0
    try:
        probe = path / ".probe" if path.is_dir() else path
        try:
            with open(probe, "ab"):
                pass
        except OSError:
            pass
        else:
            if path.is_dir():
                probe.unlink()
            pytest.skip("cannot make a path read-only here")
        yield path
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(0o755 if path.is_dir() else 0o644)


def test_generate_data_unknown_name_and_read_only_root(tmp_path, capsys):
    line = one_line(["generate-data", "--root", tmp_path / "d", "--datasets", "nosuch"], capsys)
    assert "unknown dataset 'nosuch' (known: coco, caltech101" in line
    (tmp_path / "ro").mkdir()
    with _read_only(tmp_path / "ro") as folder:
        line = one_line(["generate-data", "--root", folder, "--datasets", "caltech101"], capsys)
        assert f"{folder}: cannot write" in line and list(folder.iterdir()) == []
    nothing_written(tmp_path / "d")


def test_best_export_into_a_read_only_folder(tmp_path, capsys):
    (tmp_path / "ro").mkdir()
    with _read_only(tmp_path / "ro") as folder:
        line = one_line(["best", "--export", folder, "--tracking-uri",
                         f"sqlite:///{tmp_path / 'mlflow.db'}"], capsys)
        assert f"{folder}: cannot write" in line and list(folder.iterdir()) == []


def test_pretrain_into_a_missing_folder_on_a_read_only_file_system(tmp_path, capsys,
                                                                    read_only):
    (tmp_path / "ro").mkdir()
    folder = read_only(tmp_path / "ro")
    out = folder / "missing" / "w.pt"
    line = one_line(["pretrain-tiny", "--out", out, "--num-images", "26", "--epochs", "1"],
                    capsys)
    assert f"{out}: cannot write (" in line and "for the pretrained weights" in line
    assert list(folder.iterdir()) == []


def test_demo_whose_work_folder_is_a_file_checks_it_first(tmp_path, capsys, monkeypatch):
    import vacsr.demo

    def pretrain(*args, **kwargs):
        raise AssertionError("pretraining started before the work folder was checked")

    monkeypatch.setattr(vacsr.demo, "install_pretrained", pretrain)
    (tmp_path / "work").write_text("a file\n")
    line = one_line(["demo", "--workdir", tmp_path / "work"], capsys)
    assert f"{tmp_path / 'work'}: is a file; expected a folder for the demo" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]


# ---------------------------------------------------------------- H: vacsr best reads only
def test_best_on_a_missing_store_creates_none(tmp_path, capsys):
    db = tmp_path / "nothere" / "mlflow.db"
    line = one_line(["best", "--tracking-uri", f"sqlite:///{db}"], capsys)
    assert f"no MLflow store at {db} (no such file)" in line
    assert list(tmp_path.iterdir()) == []


def test_best_without_a_uri_creates_no_store_here(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    line = one_line(["best"], capsys)
    assert f"no MLflow store at {tmp_path / 'mlflow.db'}" in line and "--tracking-uri" in line
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- I: one run folder, one run
def _wait_for(predicate, timeout_s: float, what: str, process=None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{what}: the process ended ({process.returncode}): "
                                 f"{process.stderr.read()[-2000:]}")
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_second_train_into_a_running_folder_is_refused(tmp_path, weights):
    """Two real `vacsr train` into one folder with other settings: the second is refused naming
    the first's pid and host while the first runs (stopped with SIGSTOP so that it surely still
    does), and the first then ends with records of its own settings only."""
    run = tmp_path / "run"
    argv = ["train", *TINY, "train.epochs=3", f"model.pretrained={weights}",
            f"train.output_dir={run}"]
    first = subprocess.Popen([sys.executable, "-m", "vacsr.cli", *map(str, argv)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        _wait_for(lambda: (run / "config.yaml").is_file(), 240, "the first run's config.yaml",
                  first)
        os.kill(first.pid, signal.SIGSTOP)
        time.sleep(1.0)
        second = _cli([*argv, "optim.lr=0.002", "train.seed=7"])
        os.kill(first.pid, signal.SIGCONT)
        line = refused(second)
        assert f"{run}: another vacsr train is running in this folder (pid {first.pid} on " \
               f"{socket.gethostname()})" in line
        assert first.wait(timeout=300) == 0, first.stderr.read()[-3000:]
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGCONT)
            first.kill()
            first.wait()
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert (config["optim"]["lr"], config["train"]["seed"]) == (0.0005, 1)
    state = torch.load(run / "last.ckpt", weights_only=True)
    assert state["epoch"] == 2 and state["config"] == config and len(state["history"]) == 3
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "last.ckpt", "metrics.json"]


_HOLD_RUN_FOLDER = """
import sys, time
from vacsr.config import load_config
from vacsr.train.run_folder import lock_run_folder
lock_run_folder(load_config(overrides=["train.output_dir=" + sys.argv[1]]))
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _hold_run_folder(folder: Path, seconds: float, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _HOLD_RUN_FOLDER, str(folder), str(seconds)],
                            text=True, env={**os.environ, "PYTHONPATH": os.getcwd()}, **popen)


def test_a_run_folder_lock_is_reentrant_in_its_process_and_dropped_when_it_dies(tmp_path):
    """The CLI and the train() it calls both hold the folder; another process is refused while
    they do; release removes the lock file and the folders made for it; a SIGKILLed holder's
    lock is dropped by the kernel."""
    from vacsr.config import load_config
    from vacsr.errors import ConfigError
    from vacsr.train.run_folder import lock_run_folder

    run = tmp_path / "a" / "run"
    config = load_config(overrides=[f"train.output_dir={run}"])
    outer = lock_run_folder(config)
    lock_run_folder(config).release()  # the library entry inside the command
    other = _hold_run_folder(run, 0, stderr=subprocess.PIPE)
    assert other.wait(timeout=120) != 0
    assert f"another vacsr train is running in this folder (pid {os.getpid()} on " \
           f"{socket.gethostname()})" in other.stderr.read()
    outer.release()
    assert list(tmp_path.iterdir()) == []
    killed = _hold_run_folder(run, 120, stdout=subprocess.PIPE)
    try:
        assert killed.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=f"pid {killed.pid} on"):
            lock_run_folder(config)
    finally:
        killed.kill()
        killed.wait()
    lock_run_folder(config).release()  # the kernel dropped the killed holder's lock


# ---------------------------------------------------------------- J: creating one store at once
_OPEN_STORE = """
import sys, time
from pathlib import Path
from vacsr.records.tracker import MlflowTracker
Path(sys.argv[2]).touch()
while not Path(sys.argv[3]).exists():
    time.sleep(0.001)
tracker = MlflowTracker("sqlite:///" + sys.argv[1])
print(len(tracker.client.search_experiments()))
"""


def test_processes_creating_one_store_at_once_all_succeed(tmp_path):
    db, go = tmp_path / "store" / "mlflow.db", tmp_path / "go"
    db.parent.mkdir()
    ready = [tmp_path / f"ready-{i}" for i in range(3)]
    procs = [subprocess.Popen([sys.executable, "-c", _OPEN_STORE, str(db), str(mark), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()}) for mark in ready]
    try:
        _wait_for(lambda: all(mark.exists() for mark in ready), 240, "the processes to start")
        go.touch()  # all at once
        outs = [proc.communicate(timeout=240) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert [proc.returncode for proc in procs] == [0, 0, 0], [err[-1500:] for _, err in outs]
    assert [out.strip() for out, _ in outs] == ["1", "1", "1"]  # the Default experiment


# ---------------------------------------------------------------- K: the tracking store and server
@contextlib.contextmanager
def _serving(status: int, body: bytes, accepted: str | None = None):
    """A local server answering `status` and the JSON `body` to every request, or, to requests
    whose Authorization header is `accepted`, what MLflow answers for a missing experiment."""
    def reply(request) -> tuple[int, bytes]:
        if accepted is not None and request.headers.get("Authorization") == accepted:
            return 404, b'{"error_code": "RESOURCE_DOES_NOT_EXIST"}'
        return status, body

    with http_serving(responding(reply)) as uri:
        yield uri


REFUSED = b'{"error_code": "UNAUTHENTICATED", "message": "wrong credentials"}'


@pytest.fixture
def no_mlflow_credentials(monkeypatch):
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN",
                 "MLFLOW_TRACKING_AUTH", "MLFLOW_TRACKING_AWS_SIGV4"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")  # no ~/.mlflow/credentials


@pytest.mark.parametrize("status", [401, 403])
def test_train_with_refused_credentials_is_one_line(tmp_path, capsys, weights, status,
                                                    no_mlflow_credentials, no_model_built):
    with _serving(status, REFUSED) as uri:
        given = uri.replace("//", "//alice:wrong@")
        line = one_line(["train", *TINY, f"model.pretrained={weights}", "tracking.enabled=true",
                         f"tracking.uri={given}", f"train.output_dir={tmp_path / 'run'}"],
                        capsys)
    shown = uri.replace("//", "//alice:***@")
    assert line.startswith(f"vacsr: error: MLflow tracking URI {shown}: the server refused the "
                           f"credentials (HTTP {status}; sent user 'alice' and a password)")
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        assert name in line
    assert "wrong" not in line and list(tmp_path.iterdir()) == []


def test_tracking_check_sends_the_credentials_mlflow_would(no_mlflow_credentials, monkeypatch):
    from vacsr.errors import ConfigError
    from vacsr.records import check_tracking_uri

    basic = "Basic " + base64.b64encode(b"alice:right").decode()
    with _serving(401, REFUSED, accepted=basic) as uri:
        check_tracking_uri(uri.replace("//", "//alice:right@"), timeout_s=2.0)
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "right")
        check_tracking_uri(uri, timeout_s=2.0)
    with _serving(403, REFUSED, accepted="Bearer t0ken") as uri:
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "t0ken")
        check_tracking_uri(uri, timeout_s=2.0)
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "other")
        with pytest.raises(ConfigError, match=r"HTTP 403; sent the token in MLFLOW_TRACKING_TOKEN"):
            check_tracking_uri(uri, timeout_s=2.0)


def test_json_server_that_is_not_mlflow_leaves_no_run_folder(tmp_path, capsys, weights,
                                                             no_model_built):
    with _serving(200, b'{"status": "ok"}') as uri:
        line = one_line(["train", *TINY, f"model.pretrained={weights}", "tracking.enabled=true",
                         f"tracking.uri={uri}", f"train.output_dir={tmp_path / 'run'}"],
                        capsys)
    assert f"MLflow tracking URI {uri}: answered, but not as an MLflow tracking server" in line
    assert list(tmp_path.iterdir()) == []


def test_json_server_that_is_not_mlflow(tmp_path, capsys):
    with _serving(200, b'{"status": "ok"}') as uri:
        line = one_line(["train", "tracking.enabled=true", f"tracking.uri={uri}",
                         "train.device=cpu", f"train.output_dir={tmp_path / 'run'}"], capsys)
    assert f"MLflow tracking URI {uri}: answered, but not as an MLflow tracking server" in line
    nothing_written(tmp_path / "run")


def test_sqlite_store_that_cannot_be_written_while_its_folder_can(tmp_path, capsys):
    import sqlite3

    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.close()
    before = db.read_bytes()
    with _read_only(db):
        line = one_line(["train", "tracking.enabled=true", f"tracking.uri=sqlite:///{db}",
                         "train.device=cpu", f"train.output_dir={tmp_path / 'run'}"], capsys)
    assert f"{db} is not a writable SQLite database" in line
    assert db.read_bytes() == before and sorted(p.name for p in db.parent.iterdir()) == [db.name]
    nothing_written(tmp_path / "run")
