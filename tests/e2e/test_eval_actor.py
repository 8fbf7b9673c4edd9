"""Ray evaluation pool: sharded scoring on actors equals local scoring, weights update in place."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import small_adapter
from vacsr.eval.evaluate import evaluate_retrieval
from vacsr.eval.scorer import ChunkedScorer
from vacsr.eval.two_stage import two_stage_score

ray = pytest.importorskip("ray")

RAY_LOCAL = {"log_to_driver": False}  # for conftest's ray_local


def _features(n, dim, seed):
    return F.normalize(torch.randn(n, dim, generator=torch.Generator().manual_seed(seed)), dim=1)


def _assert_same(a, b):
    assert torch.equal(a.indices, b.indices)
    torch.testing.assert_close(a.scores, b.scores, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.sigma, b.sigma, atol=1e-5, rtol=1e-5)


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_pool_equals_local_scorer_and_follows_weight_updates(ray_local):
    from vacsr.distributed import EvalPool

    images = _features(30, 16, 0)
    captions = F.normalize(images.repeat_interleave(5, 0) + 0.4 * _features(150, 16, 1), dim=1)
    caption_to_image = torch.arange(30).repeat_interleave(5)
    groups = dict(query_groups=torch.arange(30) // 6, item_groups=caption_to_image // 6)
    head = small_adapter(0, hidden_dim=24)
    pool = EvalPool(head, captions, num_actors=2, num_cpus_per_actor=1)
    try:
        assert [d["num_items"] for d in pool.describe()] == [150, 150]
        remote = pool.score(images, captions, k=7, k_items=5, **groups)
        local = ChunkedScorer(head, device="cpu").score(images, captions, k=7, k_items=5, **groups)
        for name in ("query_topk", "item_topk", "query_topk_grouped", "item_topk_grouped"):
            _assert_same(getattr(remote, name), getattr(local, name))
        assert remote.stats["actors"] == 2

        new_head = small_adapter(1, hidden_dim=24)  # a later epoch: only the weights travel
        pool.update_head(new_head)
        kwargs = dict(num_folds=5, device="cpu")
        remote_metrics = evaluate_retrieval(images, captions, new_head, caption_to_image,
                                            scorer=pool, **kwargs)
        local_metrics = evaluate_retrieval(images, captions, new_head, caption_to_image, **kwargs)
        assert remote_metrics.keys() == local_metrics.keys()
        for key in local_metrics:
            if key != "eval_seconds":
                assert remote_metrics[key] == pytest.approx(local_metrics[key], nan_ok=True), key
        old_metrics = evaluate_retrieval(images, captions, head, caption_to_image, **kwargs)
        assert remote_metrics["sigma_top1_i2t_mean"] != pytest.approx(
            old_metrics["sigma_top1_i2t_mean"])

        staged = two_stage_score(pool, images, captions, k=5, k_prime=20)
        staged_local = two_stage_score(ChunkedScorer(new_head, device="cpu"), images, captions,
                                       k=5, k_prime=20)
        _assert_same(staged.query_topk, staged_local.query_topk)
    finally:
        pool.shutdown()


@pytest.mark.ray
@pytest.mark.timeout(300)
@pytest.mark.parametrize("task, dataset", [("retrieval", "synthetic"),
                                           ("classification", "eurosat")])
def test_checkpoint_evaluation_on_actors_equals_in_process(ray_local, tmp_path, task, dataset):
    """`vacsr eval --actors 2` (encode here, score on the EvalPool) and the sweeps' final
    evaluation (encode on the pool's first actor, score on the pool; with one actor, encode and
    score in it) give exactly the in-process metrics of the same checkpoint."""
    from vacsr.config import load_config
    from vacsr.data.generate import generate_all
    from vacsr.distributed.pool_scorer import PoolScorer
    from vacsr.train.eval_pass import OWN_DATA, encode_checkpoint, evaluate_checkpoint
    from vacsr.train.loop import Trainer

    overrides = [f"train.output_dir={tmp_path / 'run'}", "train.epochs=1", "train.progress=false",
                 "adapter.hidden_dim=16", "model.trainable_image_blocks=0",
                 "model.trainable_text_blocks=0", f"data.task={task}", f"data.dataset={dataset}"]
    if task == "classification":
        generate_all(tmp_path / "data", datasets=[dataset], per_class=(4, 3, 2))
        overrides += [f"data.root={tmp_path / 'data'}", "data.shots=2", "train.batch_size=4",
                      "model.use_gpo=false"]
    else:
        overrides += ["data.num_train=32", "data.num_test=20", "train.batch_size=16"]
    config = load_config(overrides=overrides)
    checkpoint = Trainer(config).fit().checkpoint
    expected = evaluate_checkpoint(config, checkpoint)
    scorer = PoolScorer(2, cpus_per_actor=0.5)
    try:  # the pool starts by encoding on its first actor (the sweeps' final runs); the second
        # call, encoded here, sends the head to the running actors (the next seed's checkpoint)
        got = [scorer(scorer.encode(config, checkpoint, OWN_DATA)[0]),
               scorer(encode_checkpoint(config, checkpoint)),
               scorer.evaluate(config, checkpoint, OWN_DATA)[0].metrics]
    finally:
        scorer.shutdown()
    one = PoolScorer(1, cpus_per_actor=0.5)
    try:  # the sweeps' default: encoded and scored in the one actor, only numbers come back
        got.append(one.evaluate(config, checkpoint, OWN_DATA)[0].metrics)
        damaged = tmp_path / "damaged.ckpt"  # the check of a reused trial's checkpoint
        damaged.write_bytes(b"partial")
        assert one.checkpoint_error(config, checkpoint) is None
        assert one.checkpoint_error(config, damaged).startswith(f"{damaged}: ")
    finally:
        one.shutdown()
    drop = {"eval_seconds"}
    # a NaN metric (no spread to correlate) that crossed from an actor is another float object,
    # which == tells apart: compared by its text instead
    shown = [{k: repr(v) for k, v in metrics.items() if k not in drop} for metrics in got]
    assert shown == [{k: repr(v) for k, v in expected.items() if k not in drop}] * len(got)
    got = got[0]
    assert ("rsum" if task == "retrieval" else "acc") in got


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_a_run_trained_in_the_first_actor_equals_a_local_run_after_losing_the_actor(
        ray_local, tmp_path, monkeypatch):
    """A sweep's final seed of one worker trains in the pool's first actor: killed as its second
    epoch starts, a new actor continues from the checkpoint and ends with the weights of an
    uninterrupted local run; the pool then scores that checkpoint on all its actors. A run's
    own error is one RunFailed line, not retried."""
    from vacsr.config import load_config
    from vacsr.distributed.pool_scorer import PoolScorer
    from vacsr.errors import RunFailed
    from vacsr.train.checkpoint import load_checkpoint
    from vacsr.train.eval_pass import OWN_DATA, evaluate_checkpoint
    from vacsr.train.loop import Trainer

    def config(folder: str, *extra: str):
        return load_config(overrides=[
            f"train.output_dir={tmp_path / folder}", "train.epochs=3", "train.progress=false",
            "adapter.hidden_dim=16", "model.trainable_image_blocks=1", "data.num_train=32",
            "data.num_test=20", "train.batch_size=16", "train.cpus_per_worker=0.5",
            "train.max_failures=1", *extra])

    local = Trainer(config("local")).fit()
    marker = tmp_path / "killed.txt"
    monkeypatch.setenv("VACSR_FAIL_ONCE", f"1:{marker}")  # the actor dies as epoch 2 starts
    scorer = PoolScorer(2, cpus_per_actor=0.5)
    try:
        checkpoint, notes = scorer.train(config("actor"))
        assert marker.is_file() and notes == ()
        assert len(scorer.pool.actors) == 1  # the run held one worker's resources, no more
        trained, expected = load_checkpoint(checkpoint), load_checkpoint(local.checkpoint)
        assert [h.get("resumed_from_epoch") for h in trained["history"]] == [None, 1, 1]
        for name, tensor in expected["model"].items():
            assert torch.equal(trained["model"][name], tensor), name
        metrics = scorer(scorer.encode(config("actor"), checkpoint, OWN_DATA)[0])
        assert len(scorer.pool.actors) == 2
        assert metrics["rsum"] == evaluate_checkpoint(config("local"), local.checkpoint)["rsum"]
        monkeypatch.delenv("VACSR_FAIL_ONCE")
        with pytest.raises(RunFailed) as failed:  # bad data: the run's own error
            scorer.train(config("bad", "data.task=classification", "data.dataset=eurosat",
                                f"data.root={tmp_path / 'missing'}"))
        assert "\n" not in str(failed.value) and "eurosat" in str(failed.value)
    finally:
        scorer.shutdown()


def test_an_actor_run_restores_its_checkpoint_and_retrains_after_a_damaged_one(tmp_path, capsys):
    """A new attempt of a run in an actor continues from the checkpoint in its run folder; a
    damaged one (as a full disk leaves it) is named in one line and the run starts again."""
    from types import SimpleNamespace

    from vacsr.distributed.actor_run import ActorRun
    from vacsr.train.checkpoint import save_checkpoint

    loaded = []
    path = tmp_path / "last.ckpt"
    trainer = SimpleNamespace(checkpoint_path=path, device="cpu",
                              load_state=lambda state, source: loaded.append((state, source)))
    ActorRun().restore(trainer)  # a first attempt: nothing to restore, nothing said
    assert loaded == [] and capsys.readouterr().err == ""
    path.write_bytes(b"")
    ActorRun().restore(trainer)
    [line] = capsys.readouterr().err.strip().splitlines()
    assert loaded == [] and f"{path}:" in line and "from its first epoch" in line
    save_checkpoint(path, {"epoch": 1})
    ActorRun().restore(trainer)
    assert loaded == [({"epoch": 1}, path)]
