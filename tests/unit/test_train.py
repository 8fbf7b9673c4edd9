import pytest
import torch

from conftest import assert_same_results
from vacsr.config import load_config
from vacsr.errors import CheckpointError
from vacsr.train.checkpoint import load_checkpoint, save_checkpoint
from vacsr.train.loop import Trainer


def _config(tmp_path, weights, *extra):
    return load_config(overrides=[
        f"model.pretrained={weights}", f"train.output_dir={tmp_path / 'run'}",
        "train.batch_size=64", "train.progress=false", "optim.lr=1e-3", "optim.schedule=cosine",
        "data.num_train=512", "data.num_test=100", "adapter.hidden_dim=256", *extra])


@pytest.mark.slow
def test_short_training_lowers_loss_and_raises_recall(tmp_path, tiny_weights):
    # the paper's defaults (gamma = 1, K = 2, N_h = 1, alpha 0.0005, beta 1)
    trainer = Trainer(_config(tmp_path, tiny_weights, "train.epochs=3"))
    before = trainer.evaluate("test")
    result = trainer.fit()
    first, last = result.history[0], result.history[-1]
    assert last["train/loss"] < first["train/loss"]
    chance = 1.0  # percent: 5 of 500 captions per image, 1 of 100 images per caption
    for direction in ("i2t_r1", "t2i_r1"):
        assert last[f"test/{direction}"] >= 10 * chance, last
        assert last[f"test/{direction}"] > before[direction] + 5
    assert 0 < last["test/sigma_top1_i2t_mean"] < 1


def test_resume_after_a_crash_matches_an_uninterrupted_run(tmp_path, tiny_weights):
    overrides = ("train.epochs=2", "data.num_train=32", "data.num_test=10",
                 "train.batch_size=32", "adapter.hidden_dim=32")
    straight = Trainer(_config(tmp_path / "a", tiny_weights, *overrides)).fit()

    def crash_after_first_epoch(epoch, metrics, checkpoint):
        if epoch == 0:
            raise KeyboardInterrupt("simulated crash")

    crashed = Trainer(_config(tmp_path / "b", tiny_weights, *overrides))
    with pytest.raises(KeyboardInterrupt):
        crashed.fit(callbacks=(crash_after_first_epoch,))
    resumed_trainer = Trainer(_config(tmp_path / "b", tiny_weights, *overrides))
    resumed = resumed_trainer.fit()
    assert resumed_trainer.start_epoch == 1  # continued, not restarted
    assert [h["epoch"] for h in resumed.history] == [1, 2]  # no epoch lost or repeated
    assert_same_results(straight, resumed)


def test_baseline_and_classification_paths_train(tmp_path, tiny_weights):
    baseline = Trainer(_config(tmp_path / "base", tiny_weights, "train.epochs=1",
                               "adapter.kind=sigmoid_baseline", "data.num_train=64",
                               "data.num_test=20", "train.batch_size=32")).fit()
    assert "train/sigmoid" in baseline.final_metrics and "test/rsum" in baseline.final_metrics
    classify = Trainer(_config(tmp_path / "cls", tiny_weights, "train.epochs=1",
                               "data.task=classification", "data.shots=2", "model.use_gpo=false",
                               "model.trainable_image_blocks=1", "model.trainable_text_blocks=1",
                               "train.batch_size=16", "adapter.hidden_dim=32"))
    result = classify.fit()
    assert 0 <= result.final_metrics["val/acc"] <= 100 and "test/acc" in result.final_metrics
    assert len(classify.splits["train"].classnames) == 32


def test_checkpoints_are_atomic_and_checked(tmp_path):
    path = save_checkpoint(tmp_path / "c.ckpt", {"epoch": 3, "w": torch.ones(2)})
    assert load_checkpoint(path)["epoch"] == 3
    assert not list(tmp_path.glob(".*tmp"))
    path.write_bytes(path.read_bytes()[:20])  # truncated file
    with pytest.raises(CheckpointError, match="c.ckpt"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "none.ckpt")
