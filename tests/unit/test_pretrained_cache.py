"""The tiny CLIP is pretrained once per machine: cached by its recipe's digest, verified on use."""
from __future__ import annotations

import json

import pytest

import vacsr.model.pretrain as pretrain
from vacsr.model.pretrained_cache import cached_weights, install_pretrained, recipe_digest

# a recipe that trains in seconds: one epoch of 4 batches
QUICK = {"name": "vacsr-tiny", "num_images": 26, "epochs": 1, "batch_size": 32, "lr": 2e-3,
         "seed": 0, "image_size": 32}


@pytest.fixture
def counted(tmp_path, monkeypatch):
    """The cache in tmp_path; returns the list of paths pretrain_clip wrote."""
    monkeypatch.setenv("VACSR_CACHE_DIR", str(tmp_path / "cache"))
    calls, real = [], pretrain.pretrain_clip

    def counting(out_path, **kwargs):
        calls.append(out_path)
        return real(out_path, **kwargs)

    monkeypatch.setattr(pretrain, "pretrain_clip", counting)
    return calls


def test_two_folders_get_one_pretraining_and_record_where_from(tmp_path, counted):
    first = install_pretrained(tmp_path / "a" / "tiny-clip.pt", QUICK)
    second = install_pretrained(tmp_path / "b" / "tiny-clip.pt", QUICK)
    assert len(counted) == 1  # the second folder pretrained nothing
    assert first.read_bytes() == second.read_bytes()
    source, digest = cached_weights(QUICK)
    record = json.loads((tmp_path / "b" / "tiny-clip.pt.json").read_text())
    assert record == {"sha256": digest, "source": str(source), "recipe": QUICK}
    assert source.parent == tmp_path / "cache" / "pretrained"
    assert recipe_digest(QUICK)[:16] in source.name
    assert len(counted) == 1


def test_a_damaged_cache_entry_is_pretrained_again_to_the_same_weights(tmp_path, counted,
                                                                      capsys):
    source, digest = cached_weights(QUICK)
    source.write_bytes(source.read_bytes()[:-10] + b"0123456789")  # flipped bytes, same size
    again, digest_again = cached_weights(QUICK)
    assert len(counted) == 2 and again == source
    assert digest_again == digest  # the seeded recipe gives the same file again
    assert "does not match its recorded SHA-256" in capsys.readouterr().err


def test_a_damaged_installed_copy_is_replaced(tmp_path, counted):
    dest = install_pretrained(tmp_path / "tiny-clip.pt", QUICK)
    good = dest.read_bytes()
    dest.write_bytes(b"not weights")
    install_pretrained(dest, QUICK)
    assert dest.read_bytes() == good and len(counted) == 1


def test_another_recipe_is_another_entry(tmp_path, counted):
    path, _ = cached_weights(QUICK)
    other, _ = cached_weights({**QUICK, "seed": 1})
    assert other != path and len(counted) == 2
    assert recipe_digest(QUICK) != recipe_digest({**QUICK, "seed": 1})


def test_a_sweep_folder_records_which_weights_its_runs_start_from(tmp_path, counted):
    from vacsr.model.pretrained_cache import sha256_of, weights_record

    installed = install_pretrained(tmp_path / "sweep" / "tiny-clip.pt", QUICK)
    _, digest = cached_weights(QUICK)
    assert weights_record(str(installed)) == {"path": str(installed), "sha256": digest,
                                              "recipe": QUICK}
    own = tmp_path / "mine.pt"
    own.write_bytes(installed.read_bytes() + b"x")  # a user's file: hashed, no recipe
    assert weights_record(str(own)) == {"path": str(own), "sha256": sha256_of(own)}
    installed.write_bytes(b"edited")  # no longer what its record says: hashed as it is now
    assert weights_record(str(installed))["sha256"] == sha256_of(installed) != digest
    assert weights_record("laion2b_s34b_b79k") == {"open_clip_tag": "laion2b_s34b_b79k"}
    assert weights_record(None) == {"weights": None}
