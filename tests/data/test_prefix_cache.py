"""The frozen-prefix cache of evaluation passes (vacsr/model/prefix_cache.py): exact, keyed by
everything its outputs depend on, verified on load, bounded."""
from __future__ import annotations

import os

import pytest
import torch

from vacsr.config import load_config
from vacsr.data import build_classification
from vacsr.data.generate import generate
from vacsr.methods.build import build_model
from vacsr.model.prefix_cache import PrefixCache
from vacsr.train.eval_pass import evaluate_split


@pytest.fixture(scope="module")
def dataset_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    generate(root, "dtd", seed=0, per_class=(2, 3, 3))
    return root


def _config(root, *overrides):
    return load_config(overrides=["data.task=classification", "data.dataset=dtd",
                                  f"data.root={root}", "data.shots=2", *overrides])


def _model(config, seed=0):
    torch.manual_seed(seed)
    return build_model(config).eval()


def _evaluate(model, split, cache=None):
    return evaluate_split(model, split, task="classification", device="cpu", batch_size=8,
                          cache=cache)


def _files(folder):
    return sorted(p.name for p in folder.glob("*.pt")) if folder.exists() else []


@pytest.mark.parametrize("use_gpo", [False, True])
@pytest.mark.parametrize("side,image_blocks,text_blocks", [("last", 1, 2), ("last", 0, 1),
                                                           ("first", 0, 0)])
def test_cached_and_uncached_passes_give_the_same_metrics(dataset_root, tmp_path, use_gpo, side,
                                                          image_blocks, text_blocks):
    config = _config(dataset_root, f"model.use_gpo={str(use_gpo).lower()}",
                     f"model.trainable_side={side}",
                     f"model.trainable_image_blocks={image_blocks}",
                     f"model.trainable_text_blocks={text_blocks}")
    model, splits = _model(config), build_classification(config.data, 1)
    cache = PrefixCache(tmp_path / "cache")
    for split in ("val", "test"):
        plain = _evaluate(model, splits[split])
        cold = _evaluate(model, splits[split], cache)
        warm = _evaluate(model, splits[split], cache)
        for metrics in (cold, warm):
            assert metrics.keys() == plain.keys()
            for key in plain:
                assert metrics[key] == pytest.approx(plain[key], rel=1e-5, abs=1e-6), key
    images = len(splits["val"].images) + len(splits["test"].images)
    classes = len(splits["val"].classnames) + len(splits["test"].classnames)
    assert splits["val"].prompts() == splits["test"].prompts()  # one text file serves both
    assert cache.stats.stored == images + len(splits["val"].classnames)
    assert cache.stats.served + cache.stats.stored == 2 * (images + classes)
    assert len(_files(tmp_path / "cache")) == 3


def test_a_changed_image_weights_or_depth_misses_the_cache(dataset_root, tmp_path):
    config = _config(dataset_root, "model.trainable_side=last", "model.trainable_image_blocks=1",
                     "model.trainable_text_blocks=1", "model.use_gpo=false")
    model, split = _model(config), build_classification(config.data, 1)["val"]
    folder = tmp_path / "cache"
    _evaluate(model, split, PrefixCache(folder))
    first = _files(folder)
    cache = PrefixCache(folder)
    _evaluate(model, split, cache)
    assert (cache.stats.served, cache.stats.stored) == (
        len(split.images) + len(split.classnames), 0)

    image = split.images[0]  # rewritten in place: same path, new size / mtime
    data = open(image, "rb").read()
    os.utime(image, ns=(os.stat(image).st_atime_ns, os.stat(image).st_mtime_ns + 10**9))
    cache = PrefixCache(folder)
    _evaluate(model, split, cache)
    assert cache.stats.stored == len(split.images)  # the image tower missed, the text hit
    assert open(image, "rb").read() == data

    with torch.no_grad():  # a frozen prefix weight changes (another weights file)
        model.backbone.clip.visual.transformer.resblocks[0].mlp.c_fc.bias.add_(0.01)
    cache = PrefixCache(folder)
    _evaluate(model, split, cache)
    assert cache.stats.stored == len(split.images)

    deeper = _model(_config(dataset_root, "model.trainable_side=last", "model.use_gpo=false",
                            "model.trainable_image_blocks=2", "model.trainable_text_blocks=1"))
    cache = PrefixCache(folder)
    _evaluate(deeper, split, cache)
    assert cache.stats.stored == len(split.images)  # another depth: another file
    assert len(_files(folder)) == len(first) + 3


def test_a_damaged_file_is_rebuilt_with_one_notice_and_never_used(dataset_root, tmp_path,
                                                                 capfd):
    config = _config(dataset_root, "model.trainable_side=last", "model.trainable_image_blocks=1",
                     "model.trainable_text_blocks=0", "model.use_gpo=false")
    model, split = _model(config), build_classification(config.data, 1)["test"]
    folder = tmp_path / "cache"
    expected = _evaluate(model, split, PrefixCache(folder))
    capfd.readouterr()
    for damage in (b"", os.urandom(4096), "flip"):
        image_file = next(p for p in folder.glob("image-*.pt"))
        if damage == "flip":  # a valid file whose tensor no longer matches its digest
            saved = torch.load(image_file, weights_only=True)
            saved["tokens"][0, 0, 0] += 1.0
            torch.save(saved, image_file)
        else:
            image_file.write_bytes(damage)
        cache = PrefixCache(folder)
        assert _evaluate(model, split, cache) == pytest.approx(expected)
        lines = [line for line in capfd.readouterr().err.splitlines() if " is damaged (" in line]
        assert len(lines) == 1 and str(image_file) in lines[0] and "rebuilding it" in lines[0]
        assert cache.stats.stored == len(split.images)  # recomputed, not read


def test_a_split_over_the_budget_is_evaluated_without_the_cache_said_once(dataset_root,
                                                                           tmp_path, capfd):
    config = _config(dataset_root, "model.trainable_side=last", "model.trainable_image_blocks=0",
                     "model.trainable_text_blocks=3", "model.use_gpo=true")
    model, split = _model(config), build_classification(config.data, 1)["test"]
    cache = PrefixCache(tmp_path / "cache", budget_gib=1e-6)  # ~1 KiB: not one split fits
    expected = _evaluate(model, split)
    for _ in range(2):
        assert _evaluate(model, split, cache) == pytest.approx(expected)
    notes = [line for line in capfd.readouterr().err.splitlines() if "prefix_cache_gib" in line]
    assert len(notes) == 1
    assert f"B per input x {len(split.images)} inputs" in notes[0]
    assert cache.stats.uncached == 2 * (len(split.images) + len(split.classnames))
    assert _files(tmp_path / "cache") == []


def test_a_runs_val_passes_and_its_checkpoint_evaluation_share_the_cache(dataset_root,
                                                                          tmp_path):
    """The path a sweep takes: a trial's val passes store then read the prefix, the final
    phase's base and novel test passes of the checkpoint read what the first seed stored."""
    from vacsr.train.eval_pass import encode_checkpoint
    from vacsr.train.loop import Trainer

    config = _config(dataset_root, "model.trainable_side=last", "model.trainable_image_blocks=1",
                     "model.trainable_text_blocks=1", "model.use_gpo=false", "train.epochs=2",
                     "train.batch_size=8", "train.progress=false", "train.eval_test=false",
                     f"train.output_dir={tmp_path / 'run'}",
                     f"data.prefix_cache_dir={tmp_path / 'cache'}")
    result = Trainer(config).fit()
    first, second = result.history
    assert first["prefix_cache/served"] == 0 < first["prefix_cache/evaluated"]
    assert second["prefix_cache/served"] == first["prefix_cache/evaluated"]  # epoch 2 read it
    for seed in (1, 2):  # the test images are new to the first seed (the base prompts are val's)
        encoded = [encode_checkpoint(config, result.checkpoint, subsample=part)
                   for part in ("base", "novel")]
        for split in encoded:
            assert split.cache_evaluated == len(split.image_feats) + len(split.text_feats)
            assert (split.cache_served == split.cache_evaluated) == (seed == 2)


def test_a_damaged_files_line_reaches_the_sweeps_console(dataset_root, tmp_path):
    """A pass in a Ray worker that rebuilds a damaged file: its line rides on the trial's report
    (the worker's stderr is not the console), Tune's trial event turns it into a note, and the
    sweep's progress prints it with the dataset and the trial."""
    import io

    from ray.tune.experiment import Trial

    from vacsr.results import PREFIX_CACHE_REBUILT
    from vacsr.sweep.report.progress import SweepProgress
    from vacsr.sweep.search.tune import TrialEvents

    config = _config(dataset_root, "model.trainable_side=last", "model.trainable_image_blocks=1",
                     "model.trainable_text_blocks=0", "model.use_gpo=false")
    model, split = _model(config), build_classification(config.data, 1)["test"]
    folder = tmp_path / "cache"
    _evaluate(model, split, PrefixCache(folder))
    image_file = next(folder.glob("image-*.pt"))
    image_file.write_bytes(b"")
    cache = PrefixCache(folder)
    assert cache.stats.rebuilt_note() == {}
    _evaluate(model, split, cache)
    assert len(cache.stats.rebuilt) == 1 and str(image_file) in cache.stats.rebuilt[0]

    trial = Trial("trainable", stub=True)
    trial.update_last_result({"epoch": 1, "val/acc": 50.0, "training_iteration": 1,
                              **cache.stats.rebuilt_note()})
    console = io.StringIO()
    progress = SweepProgress("demo", ["dtd"], 1, [], "val/acc", stream=console)
    TrialEvents("dtd", "val/acc", progress.event).on_trial_complete(0, [], trial)
    lines = console.getvalue().splitlines()
    assert lines[0] == (f"[demo] dtd: trial {trial.trial_id}: prefix cache: "
                        f"{cache.stats.rebuilt[0]}")
    assert " is damaged (" in lines[0] and lines[1].startswith("[demo] dtd: trial 1 done")
    assert PREFIX_CACHE_REBUILT not in cache.stats.as_metrics()  # never a metric of the history
