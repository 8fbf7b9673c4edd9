"""Chunked scorer, two-stage mode, uncertainty analysis and the evaluation entry points."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import small_adapter
from vacsr.eval.evaluate import evaluate_classification, evaluate_retrieval_detailed
from vacsr.eval.metrics import rank_topk, retrieval_metrics
from vacsr.eval.scorer import ChunkedScorer, TopK, merge_topk, naive_score
from vacsr.eval.two_stage import (
    candidate_pairs,
    cosine_candidates,
    topk_from_pairs,
    two_stage_score,
)
from vacsr.eval.uncertainty import binned_recall, pearson
from vacsr.model.adapter import SigmoidBaselineHead, VariationalSimilarityAdapter


def _features(n: int, dim: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(n, dim, generator=torch.Generator().manual_seed(seed)), dim=1)


# the scored head of these tests: small_adapter(seed, **HEAD), 2 components
HEAD = dict(embed_dim=32, hidden_dim=48, latent_dim=8, decoder_hidden_dim=16, bounded_sigma=True)


def _per_pair_reference(head, queries, items):
    """Brute force, one pair at a time through the explicit path: s_ij -> encode_pairs -> decode."""
    logits = torch.empty(len(queries), len(items))
    sigma = torch.empty(len(queries), len(items))
    with torch.no_grad():
        for i, v in enumerate(queries):
            for j, t in enumerate(items):
                mu, logvar, mix = head.encode_pairs(head.scale * v * t)
                logits[i, j] = head.decode(mu, mix)
                sigma[i, j] = head.uncertainty(logvar, mix)
    return logits, sigma


def _assert_topk_matches(topk: TopK, scores: torch.Tensor, tol: float):
    """Top-k indices equal the stable ranking of the reference scores wherever the reference
    gaps exceed the numerical tolerance (checked, so the comparison is meaningful)."""
    k = topk.indices.shape[1]
    ref = torch.sort(scores, dim=1, descending=True, stable=True)
    gaps = (ref.values[:, :k] - ref.values[:, 1:k + 1]).abs() if scores.shape[1] > k else None
    assert gaps is None or gaps.min() > 10 * tol
    assert torch.equal(topk.indices, ref.indices[:, :k])
    torch.testing.assert_close(topk.scores, ref.values[:, :k], atol=tol, rtol=0)


@pytest.mark.parametrize("query_chunk,item_chunk", [(1, 1), (4, 7), (5, 41), (23, 16), (6, 40)])
def test_chunked_scorer_equals_per_pair_brute_force(query_chunk, item_chunk):
    head = small_adapter(0, **HEAD)
    queries, items = _features(23, 32, 1), _features(41, 32, 2)
    ref_logits, ref_sigma = _per_pair_reference(head, queries, items)
    scorer = ChunkedScorer(head, device="cpu", query_chunk=query_chunk, item_chunk=item_chunk)
    result = scorer.score(queries, items, k=5, k_items=4, return_full=True)
    torch.testing.assert_close(result.scores, ref_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(result.sigma, ref_sigma, atol=1e-6, rtol=1e-5)
    _assert_topk_matches(result.query_topk, ref_logits, 1e-5)
    _assert_topk_matches(result.item_topk, ref_logits.T, 1e-5)
    rows = torch.arange(23)[:, None]
    torch.testing.assert_close(result.query_topk.sigma, ref_sigma[rows, result.query_topk.indices])


@pytest.mark.parametrize("kwargs", [dict(decoder_hidden_dim=0), dict(num_components=1),
                                    dict(bounded_sigma=False),
                                    dict(num_components=3, decoder_hidden_dim=5)])
def test_kernel_variants_equal_score_block(kwargs):
    head = small_adapter(0, **{**HEAD, **kwargs})
    queries, items = _features(9, 32, 3), _features(30, 32, 4)
    ref_logits, ref_sigma = head.score_block(queries, items)
    result = ChunkedScorer(head, device="cpu", query_chunk=4, item_chunk=7).score(
        queries, items, k=3, return_full=True)
    torch.testing.assert_close(result.scores, ref_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(result.sigma, ref_sigma, atol=1e-5, rtol=1e-5)
    logits, sigma = ChunkedScorer(head, device="cpu").score_pairs(
        queries, items, torch.tensor([0, 8, 3, 3]), torch.tensor([29, 0, 5, 6]))
    torch.testing.assert_close(logits, ref_logits[[0, 8, 3, 3], [29, 0, 5, 6]], atol=1e-5,
                               rtol=1e-5)
    torch.testing.assert_close(sigma, ref_sigma[[0, 8, 3, 3], [29, 0, 5, 6]], atol=1e-5, rtol=1e-5)


def test_naive_scorer_equals_score_block():
    head = small_adapter(0, **HEAD)
    queries, items = _features(7, 32, 5), _features(11, 32, 6)
    logits, sigma = naive_score(head, queries, items, query_chunk=3)
    ref_logits, ref_sigma = head.score_block(queries, items)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sigma, ref_sigma, atol=1e-6, rtol=1e-5)


class _QuantisedHead(torch.nn.Module):
    """Cosine rounded to 3 levels: exact ties everywhere, through the generic kernel path."""

    @torch.no_grad()
    def score_block(self, queries, items):
        return torch.round(2 * queries @ items.T), None


@pytest.mark.parametrize("query_chunk,item_chunk", [(1, 3), (7, 5), (19, 50)])
def test_exact_ties_break_to_lower_index_across_chunks(query_chunk, item_chunk):
    queries, items = _features(19, 8, 7), _features(50, 8, 8)
    scores = torch.round(2 * queries @ items.T)
    query_groups, item_groups = torch.arange(19) % 3, torch.arange(50) % 3
    result = ChunkedScorer(_QuantisedHead(), device="cpu", query_chunk=query_chunk,
                           item_chunk=item_chunk).score(queries, items, k=6, k_items=6,
                                                        query_groups=query_groups,
                                                        item_groups=item_groups)
    assert result.query_topk.sigma is None
    assert torch.equal(result.query_topk.indices,
                       torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :6])
    assert torch.equal(result.item_topk.indices,
                       torch.sort(scores.T, dim=1, descending=True, stable=True).indices[:, :6])
    same = query_groups[:, None] == item_groups[None, :]
    assert torch.equal(result.query_topk_grouped.indices, rank_topk(scores, 6, valid=same))
    assert torch.equal(result.item_topk_grouped.indices, rank_topk(scores.T, 6, valid=same.T))


def test_merge_topk_of_shards_equals_whole():
    scores = torch.round(4 * torch.rand(6, 30, generator=torch.Generator().manual_seed(9)))
    whole = rank_topk(scores, 5)
    parts = []
    for cols in (torch.arange(0, 12), torch.arange(12, 30)):
        local = rank_topk(scores[:, cols], 5)
        parts.append(TopK(indices=cols[local], scores=scores[:, cols].gather(1, local), sigma=None))
    assert torch.equal(merge_topk(parts[::-1], 5).indices, whole)  # order of shards is irrelevant


def test_memory_plan_within_budget_and_flat_in_n():
    head = VariationalSimilarityAdapter(embed_dim=512)
    scorer = ChunkedScorer(head, device="cpu", memory_budget_bytes=64 * 2**20)
    small = scorer.block_bytes(*scorer.plan(1000, 5000))
    large = scorer.block_bytes(*scorer.plan(50000, 250000))
    assert max(small, large) <= 64 * 2**20
    assert 0.8 < large / small < 1.25  # the block does not grow with N
    tight = ChunkedScorer(head, device="cpu", memory_budget_bytes=8 * 2**20)
    assert tight.block_bytes(*tight.plan(1000, 5000)) <= 8 * 2**20


def test_baseline_head_scores_without_sigma():
    head = SigmoidBaselineHead()
    queries, items = _features(12, 16, 10), _features(20, 16, 11)
    scorer = ChunkedScorer(head, device="cpu", query_chunk=5, item_chunk=6)
    result = scorer.score(queries, items, k=4)
    ref, _ = head.score_block(queries, items)
    assert result.query_topk.sigma is None and result.item_topk.sigma is None
    assert torch.equal(result.query_topk.indices, rank_topk(ref, 4))


def test_bf16_precision_close_to_fp32():
    head = small_adapter(0, **HEAD)
    queries, items = _features(10, 32, 12), _features(25, 32, 13)
    fp32 = ChunkedScorer(head, device="cpu", precision="fp32").score(queries, items,
                                                                     return_full=True)
    bf16 = ChunkedScorer(head, device="cpu", precision="bf16").score(queries, items,
                                                                     return_full=True)
    spread = fp32.scores.std()
    assert (bf16.scores - fp32.scores).abs().max() < 0.05 * spread
    assert (fp32.query_topk.indices[:, 0] == bf16.query_topk.indices[:, 0]).float().mean() >= 0.8


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_matches_cpu():
    head = small_adapter(0, **HEAD)
    queries, items = _features(64, 32, 14), _features(300, 32, 15)
    cpu = ChunkedScorer(head, device="cpu").score(queries, items, k=5, return_full=True)
    gpu = ChunkedScorer(head, device="cuda").score(queries, items, k=5, return_full=True)
    assert gpu.scores.device.type == "cpu"
    assert (gpu.scores - cpu.scores).abs().max() < 0.05 * cpu.scores.std()
    assert (gpu.query_topk.indices[:, 0] == cpu.query_topk.indices[:, 0]).float().mean() >= 0.9


# ---------------------------------------------------------------- two-stage
def test_two_stage_with_all_candidates_equals_exact():
    head = small_adapter(0, **HEAD)
    queries, items = _features(15, 32, 16), _features(40, 32, 17)
    groups = dict(query_groups=torch.arange(15) % 2, item_groups=torch.arange(40) % 2)
    scorer = ChunkedScorer(head, device="cpu", query_chunk=4, item_chunk=9)
    exact = scorer.score(queries, items, k=5, **groups)
    approx = two_stage_score(scorer, queries, items, k=5, k_prime=40, **groups)
    assert approx.stats["pairs"] == 15 * 40
    for name in ("query_topk", "item_topk", "query_topk_grouped", "item_topk_grouped"):
        assert torch.equal(getattr(approx, name).indices, getattr(exact, name).indices), name
    torch.testing.assert_close(approx.query_topk.sigma, exact.query_topk.sigma, atol=1e-5,
                               rtol=1e-5)


def test_two_stage_scores_only_the_candidate_union():
    queries, items = _features(30, 16, 18), _features(90, 16, 19)
    candidates = cosine_candidates(queries, items, 7, device="cpu")
    q_idx, g_idx = candidate_pairs(candidates, 90)
    cos = queries @ items.T
    expected = set()
    for i, row in enumerate(rank_topk(cos, 7).tolist()):
        expected |= {(i, j) for j in row}
    for j, col in enumerate(rank_topk(cos.T, 7).tolist()):
        expected |= {(i, j) for i in col}
    assert set(zip(q_idx.tolist(), g_idx.tolist())) == expected


def test_topk_from_pairs_orders_rows_and_ties():
    rows = torch.tensor([2, 0, 2, 2, 0, 1])
    cols = torch.tensor([5, 1, 3, 4, 0, 7])
    scores = torch.tensor([1.0, 2.0, 1.0, 3.0, 2.0, 0.5])
    topk = topk_from_pairs(rows, cols, scores, None, num_rows=4, k=2)
    assert topk.indices.tolist() == [[0, 1], [7, -1], [4, 3], [-1, -1]]


# ---------------------------------------------------------------- uncertainty and entry points
def test_binned_recall_and_pearson():
    sigma = [0.0, 0.1, 0.2, 0.8, 0.9, 1.0]
    correct = [True, True, True, False, False, True]
    bins = binned_recall(sigma, correct, num_bins=2)
    assert bins["counts"] == [3, 3]
    assert bins["r1"] == [100.0, pytest.approx(100 / 3)]
    assert bins["pearson_bins"] == pytest.approx(-1.0)  # two bins: perfectly anti-correlated
    assert math.isnan(pearson([1, 2, 3], [1, 1, 1]))  # undefined for a constant sequence
    assert pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(0.9933, abs=1e-4)


def test_evaluate_retrieval_matches_dense_metrics(tmp_path):
    head = small_adapter(0, **HEAD)
    images = _features(20, 32, 20)
    captions = F.normalize(images.repeat_interleave(5, 0) + 0.3 * _features(100, 32, 21), dim=1)
    caption_to_image = torch.arange(20).repeat_interleave(5)
    scores, _ = head.score_block(images, captions)
    plot = tmp_path / "fig3.png"
    evaluation = evaluate_retrieval_detailed(images, captions, head, caption_to_image, num_folds=5,
                                             device="cpu", uncertainty_plot=plot)
    expected = retrieval_metrics(scores, caption_to_image, num_folds=5)
    assert {k: evaluation.metrics[k] for k in expected} == expected
    r = evaluation.metrics["uncertainty_i2t_pearson"]
    assert math.isnan(r) or -1.0 <= r <= 1.0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sum(evaluation.uncertainty["t2i"]["counts"]) == 100


def _reference_accuracy(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Micro accuracy (percent) of the top-1 class; argmax keeps the first (lower) of tied
    maxima."""
    return 100.0 * (int((scores.argmax(dim=1) == labels).sum()) / len(labels))


def test_evaluate_classification_matches_accuracy():
    head = small_adapter(0, **HEAD)
    images, classes = _features(40, 32, 22), _features(6, 32, 23)
    labels = torch.randint(0, 6, (40,), generator=torch.Generator().manual_seed(0))
    scores, _ = head.score_block(images, classes)
    metrics = evaluate_classification(images, classes, head, labels, device="cpu")
    assert metrics["acc"] == _reference_accuracy(scores, labels)
    assert metrics["num_samples"] == 40


def test_evaluate_classification_ties_to_the_lower_class():
    # cosine logits [[a, a, 0], [0, a, a], [0, 0, 1]]: the first two images tie between classes
    a = 2 ** -0.5
    images = torch.tensor([[a, a, 0.0], [0.0, a, a], [0.0, 0.0, 1.0]])
    classes = torch.eye(3)
    metrics = evaluate_classification(images, classes, SigmoidBaselineHead(), [0, 1, 1],
                                      device="cpu")
    # predictions 0, 1, 2 (ties to the higher class would give 1, 2, 2 and 0 correct)
    assert metrics["acc"] == pytest.approx(200 / 3)


@pytest.mark.parametrize("decoder", [16, 0])
def test_cosine_init_scored_as_the_adapter_scores_it(decoder):
    """The fused kernel, listed pairs and two-stage evaluation score the cosine-init adapter
    exactly as score_block does, and that is the baseline head's 10 cos - 10."""
    torch.manual_seed(0)
    head = VariationalSimilarityAdapter(embed_dim=32, hidden_dim=48, latent_dim=8,
                                        decoder_hidden_dim=decoder, init="cosine").eval()
    queries, items = _features(15, 32, 20), _features(40, 32, 21)
    ref_logits, ref_sigma = head.score_block(queries, items)
    torch.testing.assert_close(ref_logits, SigmoidBaselineHead().score_block(queries, items)[0],
                               atol=1e-5, rtol=0)
    scorer = ChunkedScorer(head, device="cpu", query_chunk=4, item_chunk=9)
    dense = scorer.score(queries, items, k=5, return_full=True)
    torch.testing.assert_close(dense.scores, ref_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dense.sigma, ref_sigma, atol=1e-6, rtol=1e-5)
    q_idx, g_idx = torch.tensor([0, 14, 3, 3]), torch.tensor([39, 0, 5, 6])
    logits, sigma = scorer.score_pairs(queries, items, q_idx, g_idx)
    torch.testing.assert_close(logits, ref_logits[q_idx, g_idx], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sigma, ref_sigma[q_idx, g_idx], atol=1e-6, rtol=1e-5)
    staged = two_stage_score(scorer, queries, items, k=5, k_prime=8)
    rows = torch.arange(15)[:, None]
    torch.testing.assert_close(staged.query_topk.scores,
                               ref_logits[rows, staged.query_topk.indices], atol=1e-5, rtol=1e-5)
    assert torch.equal(staged.query_topk.indices, dense.query_topk.indices)  # cosine order
