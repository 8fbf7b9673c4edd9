"""The step costs kept once measured (vacsr/sweep/cost/cost_store.py, cost_key.py): a hit for the
same step, a miss when any part of the key changes, a damaged, stale or other-version entry
measured again with one note, `--recalibrate` measuring whatever is kept, and whole files under
concurrent writers. The measurement itself is the real calibration's in test_sweep_cost_plan.py;
here a counted function stands for it."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from PIL import Image

from conftest import REPO
from vacsr.config import Config, set_value
from vacsr.sweep.cost import cost_key as ck
from vacsr.sweep.cost import cost_store as store
from vacsr.sweep.cost.calibrate import StepCosts

COSTS = StepCosts(device="cpu, 1 thread(s)", memory_gib=None, image_forward=1e-3,
                  image_backward_block=2e-4, text_forward=5e-4, text_backward_block=1e-4,
                  head_pair=3e-7, image_load=2e-4, startup=6.5, teardown=1.25)
RESOURCES = {"CPU": 0.5}


class Measure:
    """Counts its calls; returns COSTS with `startup` = the call's number (a new measurement is
    told apart from a kept one)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> StepCosts:
        self.calls += 1
        return StepCosts(**{**COSTS.as_dict(), "startup": float(self.calls)})


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VACSR_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "costs"


def _samples(folder, size: int = 32, count: int = 2) -> tuple[str, ...]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        path = folder / f"{index}.png"
        Image.new("RGB", (size, size), (index, 0, 0)).save(path)
        paths.append(str(path))
    return tuple(paths)


def _key(tmp_path, config=None, resources=RESOURCES, size: int = 32):
    return ck.cost_key(config or Config(), _samples(tmp_path / f"img{size}", size), resources,
                       None)


def _obtain(key, measure, folder=None, keep=False, recalibrate=False):
    return store.obtain_costs(key, measure, folder_entry=folder, keep_in_folder=keep,
                              recalibrate=recalibrate)


def test_the_same_step_is_measured_once_and_read_back_as_the_same_numbers(tmp_path, cache,
                                                                          capsys):
    measure = Measure()
    key = _key(tmp_path)
    costs, source = _obtain(key, measure)
    assert source.source == store.MEASURED and measure.calls == 1
    assert list(cache.iterdir()) == [store.machine_entry(key)]
    again, source = _obtain(_key(tmp_path), measure)
    assert measure.calls == 1 and again == costs and source.source == store.MACHINE_CACHE
    assert source.path == str(store.machine_entry(key)) and capsys.readouterr().err == ""
    assert "reused from the machine cache" in store.source_line(again, source)
    # what a step does not read keeps the key: the dataset, the lr, the weights, the blocks
    config = Config()
    for name, value in (("data.dataset", "dtd"), ("optim.lr", 0.1), ("model.pretrained", "x.pt"),
                        ("model.trainable_image_blocks", 1), ("train.epochs", 3)):
        set_value(config, name, value)
    assert _key(tmp_path, config) == key


@pytest.mark.parametrize("change", ["adapter.hidden_dim", "model.name", "train.amp_on_cpu",
                                    "train.device", "resources", "threads", "samples"])
def test_each_part_of_the_key_changing_measures_again(tmp_path, cache, monkeypatch, change):
    measure = Measure()
    key = _key(tmp_path)
    _obtain(key, measure)
    config, resources, size = Config(), RESOURCES, 32
    if change == "resources":
        resources = {"CPU": 1.0}
    elif change == "threads":
        monkeypatch.setenv("OMP_NUM_THREADS", "7")
    elif change == "samples":
        size = 48
    else:
        value = {"adapter.hidden_dim": 64, "model.name": "ViT-B-32", "train.amp_on_cpu": True,
                 "train.device": "cpu"}[change]
        set_value(config, change, value)
    other = _key(tmp_path, config, resources, size)
    assert other != key
    costs, source = _obtain(other, measure)
    assert source.source == store.MEASURED and measure.calls == 2
    assert len(list(cache.iterdir())) == 2


@pytest.mark.parametrize("part", ["where", "versions", "code", "calibration"])
def test_a_sweep_folder_entry_of_another_machine_or_version_is_measured_again(tmp_path, cache,
                                                                              capsys, part):
    key = _key(tmp_path)
    folder = tmp_path / "sweep" / "costs.json"
    other = json.loads(json.dumps(key))
    other[part] = {"changed": True}
    store.write_entry(folder, other, COSTS, "2020-01-01T00:00:00+00:00")
    measure = Measure()
    costs, source = _obtain(key, measure, folder, keep=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"measured for another step ({part})" in err[0], err
    assert source.source == store.MEASURED and measure.calls == 1
    assert store.read_entry(folder, key)[0] == costs  # the run's folder now holds its costs


def test_a_changed_step_setting_is_named(tmp_path, cache, capsys):
    config = Config()
    set_value(config, "adapter.hidden_dim", 64)
    folder = tmp_path / "costs.json"
    store.write_entry(folder, _key(tmp_path), COSTS, "t")
    _obtain(_key(tmp_path, config), Measure(), folder)
    assert "another step (step (adapter.hidden_dim))" in capsys.readouterr().err


def _damage_bytes(path):
    path.write_bytes(path.read_bytes()[:-20])


def _damage_number(path):
    entry = json.loads(path.read_text())
    entry["costs"]["image_forward"] *= 10  # a plausible number that is not what was measured
    path.write_text(json.dumps(entry))


def _stale_schema(path):
    entry = json.loads(path.read_text())
    entry["schema"] = 0
    path.write_text(json.dumps(entry))


@pytest.mark.parametrize("damage, why", [(_damage_bytes, "damaged (not a JSON entry)"),
                                         (_damage_number, "damaged (its SHA-256"),
                                         (_stale_schema, "stale (schema 0")])
def test_a_damaged_or_stale_entry_is_measured_again_with_one_note(tmp_path, cache, capsys,
                                                                  damage, why):
    key = _key(tmp_path)
    first, _ = _obtain(key, Measure())
    damage(store.machine_entry(key))
    capsys.readouterr()
    measure = Measure()
    costs, source = _obtain(key, measure)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and why in err[0] and str(store.machine_entry(key)) in err[0], err
    assert source.source == store.MEASURED and measure.calls == 1
    assert store.read_entry(store.machine_entry(key), key) == (costs, source.measured_at, None)


def test_recalibrate_measures_whatever_is_kept(tmp_path, cache):
    key = _key(tmp_path)
    folder = tmp_path / "sweep" / "costs.json"
    measure = Measure()
    _obtain(key, measure, folder, keep=True)
    costs, source = _obtain(key, measure, folder, keep=True, recalibrate=True)
    assert measure.calls == 2 and source.source == store.MEASURED and costs.startup == 2.0
    for path in (folder, store.machine_entry(key)):  # both places hold the new measurement
        assert store.read_entry(path, key)[0].startup == 2.0


def test_a_run_reads_its_folder_first_and_keeps_a_machine_hit_there(tmp_path, cache):
    key = _key(tmp_path)
    folder = tmp_path / "sweep" / "costs.json"
    measure = Measure()
    _obtain(key, measure)  # an earlier sweep on this machine (or a --plan)
    costs, source = _obtain(key, measure, folder, keep=True)
    assert source.source == store.MACHINE_CACHE and measure.calls == 1
    store.machine_entry(key).unlink()  # the machine's cache cleared: the folder still has them
    again, source = _obtain(key, measure, folder, keep=True)
    assert source.source == store.SWEEP_FOLDER and again == costs and measure.calls == 1
    # a --plan reads but never writes the sweep folder
    other = tmp_path / "other" / "costs.json"
    _obtain(key, measure, other, keep=False)
    assert not other.exists()


def test_concurrent_writers_leave_one_whole_entry(tmp_path, cache):
    key = _key(tmp_path)
    path = store.machine_entry(key)
    written = [StepCosts(**{**COSTS.as_dict(), "startup": float(n)}) for n in range(16)]
    threads = [threading.Thread(target=store.write_entry, args=(path, key, costs, "t"))
               for costs in written]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    costs, _, why = store.read_entry(path, key)
    assert why is None and costs in written
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_the_code_digest_covers_every_module_a_calibrated_step_imports(tmp_path):
    """A model module outside STEP_CODE would change the step's time and not the key."""
    probe = ("import sys\nfrom vacsr.compute_device import resolve_device\n"
             "from vacsr.data.base import load_image\nfrom vacsr.model.prefix import blocks\n"
             "from vacsr.methods.build import build_model\n"
             "print('\\n'.join(m.__file__ for n, m in sys.modules.items()\n"
             "                 if n.startswith('vacsr.model') and getattr(m, '__file__', None)))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.split()
    covered = {str(p.resolve()) for p in ck.step_code_files()}
    assert out and {str(Path(f).resolve()) for f in out} <= covered
    # and a changed byte in any of them is a new key
    copy = tmp_path / "vacsr"
    for path in ck.step_code_files():
        target = copy / path.relative_to(REPO / "vacsr")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    before = ck.code_digest(copy)
    assert before == ck.code_digest(REPO / "vacsr")
    (copy / "model" / "adapter.py").write_text((copy / "model" / "adapter.py").read_text() + "#")
    assert ck.code_digest(copy) != before
