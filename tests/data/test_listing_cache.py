"""The folder-listing cache: equal to a fresh scan, no scan when unchanged, rebuilt on any change,
on damage, and written to the cache folder when the data folder is read-only."""
from __future__ import annotations

import os
import pickle
import random
import time
from pathlib import Path

import pytest

import vacsr.data.listing_cache as lc
from vacsr.data import classification
from vacsr.data.checked_io import files_in, subdirs
from vacsr.data.classification import load_classification
from vacsr.data.imagenet import read_imagenet
from vacsr.errors import StorageError

WNIDS = ["n01440764", "n01443537", "n01484850"]
OLD = time.time() - 3600  # a dataset that has not changed for an hour


def touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")


def make_tree(root: Path, seed: int = 0) -> Path:
    rng = random.Random(seed)
    for wnid in WNIDS:
        for number in rng.sample(range(1, 20_000), rng.randint(3, 8)):
            touch(root / wnid / f"{wnid}_{number}.JPEG")
        touch(root / wnid / ".DS_Store")  # hidden: never listed
    return root


def settle(root: Path) -> None:
    """Date every folder an hour back, as for data that has been sitting on disk."""
    for path in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        os.utime(path, (OLD, OLD))


def scan(root: Path) -> dict[str, list[str]]:
    return {name: files_in(root / name) for name in subdirs(root)}


@pytest.fixture(autouse=True)
def _cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("VACSR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("VACSR_LISTING_CACHE", raising=False)


@pytest.fixture
def tree(tmp_path) -> Path:
    root = make_tree(tmp_path / "data" / "train")
    settle(root)
    return root


@pytest.fixture
def scans(monkeypatch) -> list[str]:
    """Names of the class folders listed from the file system (not from the cache)."""
    listed: list[str] = []

    def counting(path: Path) -> list[str]:
        listed.append(Path(path).name)
        return files_in(path)

    monkeypatch.setattr(lc, "files_in", counting)
    return listed


def test_cached_listing_equals_scan(tree, scans):
    expected = scan(tree)
    first = lc.list_tree(tree)
    assert first == expected and list(first) == WNIDS
    assert all(names == sorted(names) and ".DS_Store" not in names for names in first.values())
    assert (tree.parent / "train.listing.pkl").is_file()
    assert lc.list_tree(tree) == expected
    assert scans == WNIDS  # the first load only


def test_second_load_does_not_scan(tree, scans):
    lc.list_tree(tree)
    scans.clear()
    lc.list_tree(tree)
    assert scans == []


def _add_file(root):
    touch(root / WNIDS[1] / f"{WNIDS[1]}_99999.JPEG")
    return [WNIDS[1]]


def _remove_file(root):
    (root / WNIDS[0] / files_in(root / WNIDS[0])[0]).unlink()
    return [WNIDS[0]]


def _rename_file(root):
    first = root / WNIDS[2] / files_in(root / WNIDS[2])[0]
    first.rename(first.with_name(f"{WNIDS[2]}_00001.JPEG"))
    return [WNIDS[2]]


def _add_folder(root):
    touch(root / "n01491361" / "n01491361_1.JPEG")
    return ["n01491361"]


@pytest.mark.parametrize("change", [_add_file, _remove_file, _rename_file, _add_folder])
def test_change_invalidates_only_that_folder(tree, scans, change):
    before = lc.list_tree(tree)
    scans.clear()
    changed = change(tree)
    for name in changed:  # settled by the next load: only the fingerprints can tell
        os.utime(tree / name, (OLD + 60, OLD + 60))
    os.utime(tree, (OLD + 60, OLD + 60))
    after = lc.list_tree(tree)
    assert after == scan(tree) and after != before
    assert scans == changed


def test_read_mode_reads_the_cache_and_writes_none(tree, scans, monkeypatch):
    """VACSR_LISTING_CACHE=read (a sweep's --plan): unchanged folders come from the cache, a
    changed one is listed again, and the cache file stays as the last run wrote it."""
    lc.list_tree(tree)
    cache = tree.parent / "train.listing.pkl"
    written = cache.read_bytes()
    monkeypatch.setenv("VACSR_LISTING_CACHE", "read")
    scans.clear()
    changed = _add_file(tree)
    os.utime(tree / changed[0], (OLD + 60, OLD + 60))
    assert lc.list_tree(tree) == scan(tree)
    assert scans == changed and cache.read_bytes() == written


def test_removed_class_folder_disappears(tree):
    lc.list_tree(tree)
    for path in (tree / WNIDS[0]).iterdir():
        path.unlink()
    (tree / WNIDS[0]).rmdir()
    assert list(lc.list_tree(tree)) == WNIDS[1:]
    os.utime(tree, (OLD + 60, OLD + 60))  # settled: the tree's fingerprint still tells
    (tree / WNIDS[1]).rename(tree / "n09999999")
    os.utime(tree, (OLD + 120, OLD + 120))
    assert list(lc.list_tree(tree)) == [WNIDS[2], "n09999999"]


def test_unchanged_tree_is_not_listed(tree, monkeypatch):
    expected = scan(tree)
    lc.list_tree(tree)
    listed = []
    real = os.scandir
    monkeypatch.setattr(os, "scandir", lambda path=".": listed.append(path) or real(path))
    assert lc.list_tree(tree) == expected
    assert listed == []  # neither the tree nor a class folder


def test_recently_modified_folder_is_not_trusted(tmp_path, scans):
    # A file added in the same mtime tick as the first listing leaves the mtime unchanged; the
    # folder is fresh, so the cache must not vouch for it.
    root = make_tree(tmp_path / "fresh")
    lc.list_tree(root)
    folder = root / WNIDS[0]
    mtime = folder.stat().st_mtime_ns
    touch(folder / f"{WNIDS[0]}_77777.JPEG")
    os.utime(folder, ns=(mtime, mtime))
    assert f"{WNIDS[0]}_77777.JPEG" in lc.list_tree(root)[WNIDS[0]]


def _garbage(path: Path) -> bytes:
    return b"\x00not a pickle"


def _truncated(path: Path) -> bytes:
    return path.read_bytes()[: path.stat().st_size // 2]


def _wrong_shape(path: Path) -> bytes:
    return pickle.dumps([1, 2, 3])


def _wrong_entries(path: Path) -> bytes:
    data = pickle.loads(path.read_bytes())
    data["folders"] = {name: (entry[0], 7) for name, entry in data["folders"].items()}
    return pickle.dumps(data)


def _wrong_subdirs(path: Path) -> bytes:
    data = pickle.loads(path.read_bytes())
    data["subdirs"] = [1, 2]  # the tree's own fingerprint still matches: only the type tells
    return pickle.dumps(data)


class _Payload:
    """Would create a file when unpickled if the cache reader accepted objects."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def _other_tree(path: Path) -> bytes:
    data = pickle.loads(path.read_bytes())
    data["root"] = "/somewhere/else/train"  # e.g. a cache file copied along with its data
    return pickle.dumps(data)


def _old_format(path: Path) -> bytes:
    data = pickle.loads(path.read_bytes())
    data["format"] = "vacsr-listing/0"
    return pickle.dumps(data)


@pytest.mark.parametrize("damage", [_garbage, _truncated, _wrong_shape, _wrong_entries,
                                    _wrong_subdirs, _other_tree, _old_format, "object"])
def test_corrupt_cache_is_rebuilt(tree, scans, damage):
    expected = lc.list_tree(tree)
    path = tree.parent / "train.listing.pkl"
    marker = tree.parent / "marker"
    payload = (pickle.dumps({"format": lc.LISTING_VERSION, "root": str(tree.resolve()),
                             "folders": _Payload(marker)})
               if damage == "object" else damage(path))
    path.write_bytes(payload)
    scans.clear()
    assert lc.list_tree(tree) == expected
    assert scans == WNIDS and not marker.exists()
    scans.clear()
    lc.list_tree(tree)  # the rebuilt file is valid again
    assert scans == []


@pytest.fixture
def freeze(monkeypatch):
    """Make the folder holding a tree unwritable: chmod, and, for root (who ignores permissions),
    the failure atomic_write_bytes reports for EACCES / EROFS."""
    frozen: list[Path] = []
    real = lc.atomic_write_bytes

    def refusing(path, payload):
        if Path(path).parent in frozen:
            raise StorageError(f"{path}: cannot write (read-only file system)")
        return real(path, payload)

    def apply(tree: Path) -> Path:
        frozen.append(tree.parent)
        tree.parent.chmod(0o555)
        return tree

    monkeypatch.setattr(lc, "atomic_write_bytes", refusing)
    yield apply
    for folder in frozen:
        folder.chmod(0o755)


def test_read_only_data_folder_falls_back_to_cache_dir(tree, freeze, tmp_path, scans):
    freeze(tree)
    expected = lc.list_tree(tree)
    assert not (tree.parent / "train.listing.pkl").exists()
    assert len(list((tmp_path / "cache" / "listings").glob("train-*.listing.pkl"))) == 1
    scans.clear()
    assert lc.list_tree(tree) == expected and scans == []


def test_stale_file_beside_data_loses_to_newer_fallback(tree, freeze, scans):
    lc.list_tree(tree)  # written beside the data before it became read-only
    os.utime(tree.parent / "train.listing.pkl", (OLD, OLD))
    freeze(tree)
    _add_file(tree)
    lc.list_tree(tree)  # lists the changed folder; the update goes to the cache folder
    settle(tree)  # the changed folder gets its old mtime back: only the newer file knows better
    lc.list_tree(tree)
    scans.clear()
    assert lc.list_tree(tree) == scan(tree) and scans == []


def test_environment_rebuild_and_off(tree, scans, monkeypatch, tmp_path):
    lc.list_tree(tree)
    scans.clear()
    monkeypatch.setenv("VACSR_LISTING_CACHE", "rebuild")
    lc.list_tree(tree)
    assert scans == WNIDS
    other = make_tree(tmp_path / "other" / "train", seed=1)
    settle(other)
    monkeypatch.setenv("VACSR_LISTING_CACHE", "off")
    assert lc.list_tree(other) == scan(other)
    assert not (other.parent / "train.listing.pkl").exists()
    assert not list((tmp_path / "cache").rglob("*.pkl"))


def make_imagenet(root: Path) -> Path:
    """A 3-class ImageNet layout (images/{train,val}/<wnid>/, classnames.txt), settled."""
    dataset = root / "imagenet"
    (dataset / "images").mkdir(parents=True)
    (dataset / "classnames.txt").write_text("".join(f"{w} class {i}\n"
                                                    for i, w in enumerate(WNIDS)))
    for split in ("train", "val"):
        make_tree(dataset / "images" / split, seed=len(split))
        settle(dataset / "images" / split)
    return dataset


def test_imagenet_reader_uses_the_cache(tmp_path, scans):
    dataset = make_imagenet(tmp_path)
    _, first = read_imagenet(tmp_path)
    assert len(scans) == 2 * len(WNIDS)
    scans.clear()
    _, second = read_imagenet(tmp_path)
    assert scans == [] and second == first
    assert (dataset / "images" / "train.listing.pkl").is_file()
    touch(dataset / "images" / "train" / WNIDS[2] / f"{WNIDS[2]}_1.JPEG")
    _, third = read_imagenet(tmp_path)
    added = [item for item in third["train"] if item.path.endswith(f"{WNIDS[2]}_1.JPEG")]
    assert [(item.label, item.classname) for item in added] == [(2, "class 2")]


def test_cached_imagenet_trial_load_lists_no_class_folder(tmp_path, monkeypatch):
    """The whole trial-time load, not only the reader: nothing lists a class folder again."""
    make_imagenet(tmp_path)
    monkeypatch.setattr(classification, "_check_class_count", lambda *args: None)  # 3, not 1000
    first = load_classification(tmp_path, "imagenet", shots=2, seed=1, subsample="all")
    listed: list[Path] = []
    for name in ("scandir", "listdir"):
        real = getattr(os, name)

        def counting(path=".", _real=real):
            listed.append(Path(path))
            return _real(path)

        monkeypatch.setattr(os, name, counting)
    second = load_classification(tmp_path, "imagenet", shots=2, seed=1, subsample="all")
    assert [path for path in listed if path.parent.name in ("train", "val")] == []
    assert [path for path in listed if path.name in ("train", "val")] == []  # nor the trees
    assert {k: (v.images, v.labels) for k, v in second.items()} == \
        {k: (v.images, v.labels) for k, v in first.items()}
