"""The sweeps follow the paper's training protocols (appendix C.2) and search the loss reading
of appendix E.1; retrieval test evaluation reports the COCO 1K recalls."""
from dataclasses import replace

import pytest

from conftest import sweep_plan
from sweeps.base2novel import SWEEP as BASE2NOVEL
from sweeps.domain_generalization import SWEEP as DG
from sweeps.retrieval import SWEEP as RETRIEVAL
from vacsr.config import load_config
from vacsr.errors import ConfigError
from vacsr.sweep.spec.paper import BASE_TO_NOVEL_BATCH_SIZES
from vacsr.sweep.spec.space import Choice, dataset_space
from vacsr.train.optim import lr_factor

KINDS = {k.name: k for k in (BASE2NOVEL, DG, RETRIEVAL)}


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_space_searches_the_negative_sigma_target(name):
    assert KINDS[name].space["loss.neg_sigma_target"] == Choice(("label", "positive"))


@pytest.mark.parametrize("embedded", [False, True])
def test_domain_generalization_fixes_the_paper_protocol(tmp_path, monkeypatch, embedded):
    fixed = {"model.trainable_image_blocks", "model.trainable_text_blocks", "train.epochs",
             "model.trainable_side"}
    # embedded: the profile without writing data or pretraining the tiny CLIP
    plan = sweep_plan(DG, tmp_path, data=None if embedded else tmp_path / "data",
                      monkeypatch=monkeypatch)
    assert not fixed & set(plan.spaces["imagenet"])  # not searched, even by the profile
    config = plan.configs["imagenet"]
    assert (config.model.trainable_image_blocks, config.model.trainable_text_blocks) == (2, 3)
    assert config.model.trainable_side == "first"  # C.2: "the first two layers ... first three"
    assert (config.train.epochs, config.optim.schedule) == (5, "cosine")
    assert config.data.subsample_classes == "all"
    assert [e.dataset for e in DG.evaluations] == ["imagenetv2", "imagenet_sketch",
                                                  "imagenet_a", "imagenet_r"]


def test_set_changes_a_protocol_value_and_range_on_it_is_refused(tmp_path):
    plan = sweep_plan(DG, tmp_path,
                      ["--set", "train.epochs=7", "--set", "model.trainable_image_blocks=1"],
                      data=tmp_path / "data")
    config = plan.configs["imagenet"]
    assert (config.train.epochs, config.model.trainable_image_blocks) == (7, 1)
    assert not set(DG.protocol) & set(plan.spaces["imagenet"])  # still fixed, never searched
    with pytest.raises(ConfigError, match=r"--range model.trainable_text_blocks: the "
                                          r"domain_generalization protocol fixes it"):
        sweep_plan(DG, tmp_path, ["--range", "model.trainable_text_blocks=int:0:2"],
                   data=tmp_path / "data")


@pytest.mark.parametrize("name", sorted(KINDS))
def test_no_kind_searches_a_key_its_protocol_fixes(name):
    """One rule for what is fixed: retrieval's lr is C.2's 5e-4, so not searched."""
    kind = KINDS[name]
    assert not set(kind.protocol) & set(kind.searched_keys)
    with pytest.raises(ValueError, match=rf"sweep kind {name}: its protocol fixes loss.beta, "
                                         "which its space also searches"):
        replace(kind, protocol={**kind.protocol, "loss.beta": 1.0})
    if kind.batch_sizes:  # the batch sizes it names are searched too
        with pytest.raises(ValueError, match="fixes train.batch_size"):
            replace(kind, protocol={**kind.protocol, "train.batch_size": 8})


@pytest.mark.parametrize("argv, embedded, epochs, decay", [
    ([], False, 25, 15),                  # paper C.2: 25 epochs, decay at 15
    (["--epochs", "10"], False, 10, 6),   # shorter: at 60% of the epochs
    (["--set", "train.epochs=5"], False, 5, 3),
    ([], True, 1, 1),                     # embedded default: one epoch
    (["--set", "optim.decay_epochs=[2]", "--epochs", "4"], False, 4, 2),  # --set wins
])
def test_retrieval_uses_the_step_schedule(tmp_path, monkeypatch, argv, embedded, epochs, decay):
    plan = sweep_plan(RETRIEVAL, tmp_path, argv, data=None if embedded else tmp_path / "data",
                      monkeypatch=monkeypatch)
    config = plan.configs["coco"]
    assert (config.optim.schedule, config.train.epochs) == ("step", epochs)
    assert config.optim.decay_epochs == [decay] and config.optim.lr == 5e-4
    factor = lr_factor(decay, epochs=epochs, schedule=config.optim.schedule,
                       decay_epochs=config.optim.decay_epochs)
    assert factor == pytest.approx(0.1)  # to 10% at the decay epoch


def test_base_to_novel_keeps_cosine_and_trains_on_base_classes(tmp_path):
    plan = sweep_plan(BASE2NOVEL, tmp_path, ["--datasets", "eurosat"], data=tmp_path / "data")
    config = plan.configs["eurosat"]
    assert config.optim.schedule == "cosine" and config.data.subsample_classes == "base"
    assert config.model.use_gpo is False  # classification: pooled CLIP features


@pytest.mark.parametrize("embedded", [False, True])
def test_base_to_novel_searches_the_trainable_side_from_todays_start(tmp_path, monkeypatch,
                                                                      embedded):
    """C.2 searches "the number of frozen Transformer layers": the side with the counts (0 =
    adapter and projections only); the first trial keeps the paper's defaults, `first`; each
    dataset's runs share a frozen-prefix cache folder in the sweep folder."""
    from vacsr.sweep.spec.space import start_point

    plan = sweep_plan(BASE2NOVEL, tmp_path, ["--datasets", "eurosat,dtd"],
                      data=None if embedded else tmp_path / "data", monkeypatch=monkeypatch)
    for dataset in ("eurosat", "dtd"):
        space = plan.spaces[dataset]
        assert space["model.trainable_side"] == Choice(("first", "last"))
        assert space["model.trainable_image_blocks"].low == 0
        assert start_point(space, plan.configs[dataset])["model.trainable_side"] == "first"
        assert plan.configs[dataset].data.prefix_cache_dir == str(
            plan.storage / "prefix_cache" / dataset)
    assert "model.trainable_side" not in RETRIEVAL.space  # every block trains there


def test_eurosat_batch_sizes_include_five(tmp_path):
    assert 5 in BASE_TO_NOVEL_BATCH_SIZES["eurosat"]
    space = dataset_space(BASE2NOVEL.space, BASE_TO_NOVEL_BATCH_SIZES["eurosat"])
    assert 5 in space["train.batch_size"].options
    # sizes that do not split over the Ray Train workers are left out
    space = dataset_space(BASE2NOVEL.space, BASE_TO_NOVEL_BATCH_SIZES["eurosat"], workers=2)
    assert space["train.batch_size"].options == (4, 6)
    plan = sweep_plan(BASE2NOVEL, tmp_path, ["--datasets", "eurosat", "--set",
                                             "train.batch_size=5"], data=tmp_path / "data")
    assert plan.configs["eurosat"].train.batch_size == 5  # validates with one worker


def test_retrieval_training_reports_coco_1k_recalls(tmp_path):
    from vacsr.train.loop import Trainer

    config = load_config(overrides=[
        f"train.output_dir={tmp_path / 'run'}", "train.epochs=1", "train.progress=false",
        "train.batch_size=16", "data.num_train=16", "data.num_test=10", "adapter.hidden_dim=16",
        "model.trainable_image_blocks=0", "model.trainable_text_blocks=0"])
    final = Trainer(config).fit().final_metrics
    for key in ("i2t_r1", "t2i_r1", "i2t_r10", "rsum"):
        assert f"test/coco1k_{key}" in final, sorted(final)
    assert 0 <= final["test/coco1k_i2t_r1"] <= 100
    assert not any(k.startswith("val/coco1k_") for k in final)  # val stays cheap
