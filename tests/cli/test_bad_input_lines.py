"""More bad inputs, each checked where it enters (dataset paths, config text, weights files,
checkpoints, the MLflow store, search ranges, output folders): exit status 2, one
`vacsr: error:` line naming the file or value, and nothing written."""
from __future__ import annotations

import contextlib
import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import answering, http_serving, make_dataset_folders, nothing_written, one_line
from vacsr.data.fewshot import Item, read_fewshot_cache, write_fewshot_cache
from vacsr.errors import DataError

TRAIN = ["train", "data.task=classification", "data.shots=1", "model.use_gpo=false",
         "train.batch_size=4", "train.epochs=1", "train.progress=false", "train.device=cpu",
         "adapter.hidden_dim=16"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    from vacsr.data.generate import generate_all

    return generate_all(tmp_path_factory.mktemp("data"), datasets=["caltech101", "imagenet"],
                        per_class=(2, 1, 1))


@pytest.fixture
def root(pristine, tmp_path) -> Path:
    shutil.copytree(pristine, tmp_path / "data", symlinks=True)
    return tmp_path / "data"


# ---------------------------------------------------------------- 1, 2: dataset paths
def test_split_entry_outside_the_dataset_folder(root, tmp_path, weights, capsys):
    split = root / "caltech-101" / "split_zhou_Caltech101.json"
    data = json.loads(split.read_text())
    (tmp_path / "outside").mkdir()
    shutil.copy(root / "caltech-101" / "101_ObjectCategories" / data["test"][0][0],
                tmp_path / "outside" / "x.png")
    data["test"][0][0] = "../../../outside/x.png"
    split.write_text(json.dumps(data))
    line = one_line([*TRAIN, f"model.pretrained={weights}", "data.dataset=caltech101",
                      f"data.root={root}", f"train.output_dir={tmp_path / 'run'}"], capsys)
    assert f"{split}: test[0] names '../../../outside/x.png', outside the dataset folder" in line
    assert (tmp_path / "run" / "last.ckpt").exists() is False


@pytest.mark.parametrize("where", ["class-folder", "entry"])
def test_symlink_loop_in_a_class_folder_tree(root, tmp_path, weights, capsys, where):
    train = root / "imagenet" / "images" / "train"
    first = sorted(train.iterdir())[0]
    loop = train / "n00000001" if where == "class-folder" else first / "loop.png"
    os.symlink(loop.name, loop)  # a link to itself
    line = one_line([*TRAIN, f"model.pretrained={weights}", "data.dataset=imagenet",
                      f"data.root={root}", f"train.output_dir={tmp_path / 'run'}"], capsys)
    assert f"{loop}: symbolic link loop" in line
    nothing_written(tmp_path / "run")


# ---------------------------------------------------------------- 3: few-shot caches
def _datum_cache(entries: list, state_of=lambda entry: entry) -> bytes:
    """A CoOp-style cache: pickled dassl Datum objects (module renamed after pickling)."""
    payload = pickle.dumps({"train": [_Datum(state_of(e)) for e in entries]}, protocol=2)
    return payload.replace(f"c{__name__}\n_Datum".encode(), b"cdassl.data\nDatum")


class _Datum:
    def __init__(self, state):
        self.state = state

    def __reduce__(self):
        return _Datum, (None,), self.state


def test_crafted_datum_cache_is_one_line(root, tmp_path, weights, capsys):
    cache = root / "caltech-101" / "split_fewshot" / "shot_1-seed_1.pkl"
    cache.parent.mkdir()
    cache.write_bytes(_datum_cache([0], state_of=lambda _: [1, 2]))  # a state that is no dict
    line = one_line([*TRAIN, f"model.pretrained={weights}", "data.dataset=caltech101",
                      f"data.root={root}", f"train.output_dir={tmp_path / 'run'}"], capsys)
    assert f"{cache}: unreadable few-shot cache" in line and "delete the file" in line
    nothing_written(tmp_path / "run")


def test_fuzzed_caches_load_or_raise_data_error(tmp_path):
    """Seeded mutations of a vacsr and a CoOp cache: each loads, or is one DataError line."""
    items = [Item(f"images/c{i}/img_{j}.jpg", i, f"class {i}") for i in range(4) for j in range(2)]
    write_fewshot_cache(tmp_path / "vacsr.pkl", items, items[:4])
    sources = [(tmp_path / "vacsr.pkl").read_bytes(), _datum_cache(
        [{"_impath": f"/x/oxford_pets/images/a_{i}.jpg", "_label": i, "_classname": "a"}
         for i in range(4)])]
    assert read_fewshot_cache(tmp_path / "vacsr.pkl", "oxford_pets")[0] == items
    rng, path, outcomes = random.Random(0), tmp_path / "mutated.pkl", {"loaded": 0, "refused": 0}
    for n in range(400):
        data = bytearray(sources[n % 2])
        for _ in range(rng.randint(1, 3)):
            at, kind = rng.randrange(len(data)), rng.randrange(3)
            if kind == 0:
                data[at] ^= 1 << rng.randrange(8)
            elif kind == 1:
                data.insert(at, rng.randrange(256))
            else:
                del data[at:at + rng.randint(1, 8)]
        path.write_bytes(bytes(data))
        try:
            train, val = read_fewshot_cache(path, "oxford_pets")
        except DataError as exc:
            assert "\n" not in str(exc) and str(path) in str(exc)
            outcomes["refused"] += 1
        else:
            assert all(isinstance(item, Item) for item in train + (val or []))
            outcomes["loaded"] += 1
    assert outcomes["refused"] > 300, outcomes


# ---------------------------------------------------------------- 4, 5, 7: files named by the user
@pytest.mark.parametrize("content", [bytes(random.Random(0).randrange(256) for _ in range(200)),
                                     "train:\n  epochs: 1\n".encode("utf-16")],
                         ids=["random-bytes", "utf-16"])
def test_config_file_that_is_not_utf8_text(tmp_path, capsys, content):
    path = tmp_path / "overrides.yaml"
    path.write_bytes(content)
    line = one_line(["train", "--config", path, f"train.output_dir={tmp_path / 'run'}"], capsys)
    assert f"{path}: not UTF-8 text" in line and "expected a YAML file" in line
    nothing_written(tmp_path / "run")


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


# ---------------------------------------------------------------- 8: the MLflow store
def _json_200_server():
    return http_serving(answering(200, "application/json", b'{"status": "ok"}'))


def test_json_server_that_is_not_mlflow(tmp_path, capsys):
    with _json_200_server() as uri:
        line = one_line(["train", "tracking.enabled=true", f"tracking.uri={uri}",
                          "train.device=cpu", f"train.output_dir={tmp_path / 'run'}"], capsys)
    assert f"MLflow tracking URI {uri}: answered, but not as an MLflow tracking server" in line
    nothing_written(tmp_path / "run")


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


# ---------------------------------------------------------------- 9: search ranges
@pytest.mark.parametrize("text, fragment", [
    ("optim.schedule=choice:bogus", "optim.schedule of eurosat can draw 'bogus'"),
    ("optim.schedule=choice:step,bogus", "can draw 'bogus'"),
    ("train.epochs=int:-3:2", "train.epochs of eurosat can draw -3"),
])
def test_search_range_values_are_checked_before_ray_starts(tmp_path, capsys, text, fragment):
    import ray

    from sweeps.base2novel import SWEEP
    from vacsr.sweep.cli import main as sweep_main

    line = one_line(["--datasets", "eurosat", "--data-root",
                      make_dataset_folders(tmp_path / "data"), "--storage",
                      tmp_path / "sweeps", "--range", text], capsys,
                     entry=lambda argv: sweep_main(SWEEP, argv))
    assert fragment in line
    assert not ray.is_initialized()
    assert not (tmp_path / "sweeps" / "base2novel" / "tune").exists()


# ---------------------------------------------------------------- 10: output folders
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


# ---------------------------------------------------------------- 11: a killed driver's Ray
_DRIVER = """
import os, signal, subprocess, sys, time
from vacsr.distributed.leftovers import record_instance
child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                          "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
time.sleep(0.3)
record_instance(sys.argv[1])
print(child.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="process start times come from /proc")
def test_a_dead_drivers_instance_is_ended_and_nothing_else(tmp_path, monkeypatch):
    """Real processes: a 'driver' records its SIGTERM-ignoring child as its instance, is
    SIGKILLed, and the next start ends the child; a live driver's record is left alone."""
    from vacsr.distributed import leftovers

    monkeypatch.setenv("VACSR_CACHE_DIR", str(tmp_path / "cache"))
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER, str(tmp_path / "session_dead")],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        child = int(driver.stdout.readline())
        assert leftovers.reap_dead_instances() == []  # its driver runs: not touched
        assert leftovers.start_time(child) is not None
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=10)
        live = leftovers.record_instance(str(tmp_path / "session_live"))  # this process: alive
        started = time.monotonic()
        assert leftovers.reap_dead_instances() == [child]
        assert leftovers.start_time(child) is None and time.monotonic() - started < 5
        assert sorted(p.name for p in (tmp_path / "cache" / "ray-instances").iterdir()) == [
            live.name]
    finally:
        driver.kill()
        driver.wait(timeout=10)
