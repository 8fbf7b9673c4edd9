"""The methods' comparison report (comparison.md / .csv): table.py's numbers per dataset and
method, the best methods, and the paired bootstrap intervals of the differences in H; the
domain-generalisation shape (a row per target, the shifted average) and the retrieval one
(RSUM, R@1, ECCV mAP@R, the noise ratio in the header)."""
from __future__ import annotations

import csv
import math
import random
from statistics import NormalDist

import numpy as np
import pytest

from sweeps.base2novel import SWEEP as BASE2NOVEL
from vacsr.errors import ConfigError
from vacsr.results import harmonic_mean, table_spec
from vacsr.sweep.plan.folders import COMPARISON_CSV, COMPARISON_DIFFERENCES_CSV, COMPARISON_MD
from vacsr.sweep.report.bootstrap import pair_seeds, paired_bootstrap
from vacsr.sweep.report.comparison import build_comparison, write_comparison
from vacsr.sweep.report.comparison_rows import SINGLE_EVALUATION
from vacsr.sweep.report.table import table_rows

SPEC = {"columns": [["base", "acc"], ["novel", "novel_acc"]], "harmonic": ["base", "novel"],
        "published": {}}
METRICS = ("acc", "novel_acc")
BUDGET = {"trials": 8, "seeds": [1, 2, 3], "epochs": "int:2:10", "shots": 16,
          "selection": "val/acc"}


def test_the_published_rows_follow_the_comparison_apart_from_it(tmp_path):
    """comparison.md ends with the kind's published rows (the paper's Table 5, CoOp's from
    CoCoOp), marked as their papers' numbers on the real datasets; the comparison above them,
    its best methods and its CSV are the sweep's alone."""
    spec = table_spec(BASE2NOVEL.table)
    rows, paths, _ = write_comparison(spec, HAND_MADE, {}, {}, tmp_path)
    text = paths[0].read_text()
    ours, published = text.split("\n## Published (11-dataset avg., ViT-B/16, real data, each its "
                                 "own tuning)\n")
    assert "| method | base | novel | H |" in published
    assert "| CoOp | 82.69 | 63.22 | 71.66 |" in published
    assert "| VACSR (paper) | 85.74 | 76.08 | 80.37 |" in published
    assert "MaPLe" not in ours and "published" not in ours
    assert {row["method"] for row in rows} == {"vacsr", "coop"}
    assert "MaPLe" not in (tmp_path / COMPARISON_CSV).read_text()


def _result(pairs, seeds=(1, 2, 3), val=50.0, trials=8):
    return {"val": val, "num_trials": trials, "per_seed": [
        {"seed": s, "acc": float(b), "novel_acc": float(n), "eval_seconds": 0.5}
        for s, (b, n) in zip(seeds, pairs)]}


def _zero_shot(base, novel, seed=0):
    return {"val": math.nan, "num_trials": 0,
            "per_seed": [{"seed": seed, "acc": float(base), "novel_acc": float(novel)}]}


# base / novel chosen so that every per-seed H is a whole number (2BN/(B+N) divides exactly):
# then any summation order gives the same means, and the test below can compare exactly
HAND_MADE = {
    "vacsr": {"eurosat": _result([(90, 60), (70, 70), (80, 80)]),  # H 72, 70, 80
              "dtd": _result([(60, 40), (50, 50), (75, 50)])},  # H 48, 50, 60
    "coop": {"eurosat": _result([(60, 40), (90, 45), (80, 80)]),  # H 48, 60, 80
             "dtd": _result([(50, 50), (60, 30), (90, 60)])},  # H 50, 40, 72
}
HAND_MADE_DIFFERENCES = [24.0, 10.0, 0.0, -2.0, 10.0, -12.0]  # vacsr H - coop H, pair by pair


def _resampled_means(differences: list[float], resamples: int, seed: int) -> np.ndarray:
    """The resampling done plainly: `resamples` draws of the pairs with replacement from the
    seeded Generator, each draw's mean."""
    picks = np.random.default_rng(seed).integers(0, len(differences),
                                                 size=(resamples, len(differences)))
    return np.asarray(differences)[picks].mean(axis=1)  # (B,)


def _bca_by_hand(differences: list[float], resamples: int, seed: int) -> tuple[float, float]:
    """Efron's BCa (Efron & Tibshirani 1993, 14.3) written out: the bias from where the observed
    mean sits among the resampled ones, the acceleration from the leave-one-out means' skew,
    and the 95% ends moved by both."""
    means, normal = _resampled_means(differences, resamples, seed), NormalDist()
    observed = float(np.mean(differences))
    bias = normal.inv_cdf(((means < observed).sum() + (means <= observed).sum())
                          / (2 * resamples))
    left_out = np.array([np.mean(differences[:i] + differences[i + 1:])
                         for i in range(len(differences))])
    spread = left_out.mean() - left_out
    acceleration = (spread ** 3).sum() / (6 * ((spread ** 2).sum()) ** 1.5)
    ends = []
    for tail in (0.025, 0.975):
        z = bias + normal.inv_cdf(tail)
        ends.append(100 * normal.cdf(bias + z / (1 - acceleration * z)))
    low, high = np.percentile(means, ends)
    return float(low), float(high)


def test_the_interval_is_bca_over_resampled_pair_means():
    comparison = build_comparison(SPEC, HAND_MADE, {}, {}, resamples=401, seed=7)
    best_other = comparison.differences[0]
    assert best_other.other == "coop"
    assert list(best_other.pairing.differences) == HAND_MADE_DIFFERENCES
    interval = best_other.interval
    assert interval.method == "BCa"
    assert (interval.low, interval.high) == pytest.approx(
        _bca_by_hand(HAND_MADE_DIFFERENCES, 401, 7), abs=1e-12)
    # BCa moves the ends: the differences are skewed to the reference's side
    plain = np.percentile(_resampled_means(HAND_MADE_DIFFERENCES, 401, 7), [2.5, 97.5])
    assert (interval.low, interval.high) != pytest.approx(tuple(plain))
    assert interval.observed == 5.0 and interval.pairs == 6 and interval.resamples == 401
    assert interval.low < 5.0 < interval.high
    # the default B and seed give the same interval every time
    default = build_comparison(SPEC, HAND_MADE, {}, {}).differences[0].interval
    assert (default.low, default.high) == pytest.approx(
        _bca_by_hand(HAND_MADE_DIFFERENCES, 10_000, 0), abs=1e-12)
    assert (default.resamples, default.seed) == (10_000, 0)
    assert build_comparison(SPEC, HAND_MADE, {}, {}).differences[0].interval == default


@pytest.mark.parametrize("differences", [[2.0, 5.0], [3.0, 3.0, 3.0, 3.0], [4.0]])
def test_where_bca_does_not_apply_the_interval_is_the_percentiles_and_says_so(differences):
    """Two pairs (a jackknife of two values has no skew), or every difference equal (BCa's
    acceleration is 0 / 0): the plain percentiles of the resampled means, marked as such in the
    sentence and the csv."""
    interval = paired_bootstrap(differences, resamples=401, seed=7)
    assert interval.method == "percentile"
    means = _resampled_means(differences, 401, 7)
    assert (interval.low, interval.high) == pytest.approx(
        tuple(np.percentile(means, [2.5, 97.5])), abs=1e-12)
    assert math.isfinite(interval.low) and interval.low <= interval.observed <= interval.high


def _one_side_wins(margin_sign: float) -> dict:
    rng = random.Random(3)
    results = {"vacsr": {}, "coop": {}}
    for dataset in ("eurosat", "dtd", "oxford_pets", "ucf101"):
        other = [(rng.uniform(40, 90), rng.uniform(40, 90)) for _ in range(3)]
        mine = [(b + margin_sign * rng.uniform(0.1, 3), n + margin_sign * rng.uniform(0.1, 3))
                for b, n in other]
        results["vacsr"][dataset], results["coop"][dataset] = _result(mine), _result(other)
    return results


def test_a_method_that_wins_every_pair_has_an_interval_above_zero_and_one_that_loses_below():
    winning = build_comparison(SPEC, _one_side_wins(+1), {}, {}).differences[0]
    assert winning.pairing.left_out == 0 and winning.interval.pairs == 12
    assert 0 < winning.interval.low <= winning.interval.observed <= winning.interval.high
    losing = build_comparison(SPEC, _one_side_wins(-1), {}, {}).differences[0]
    assert losing.interval.low <= losing.interval.high < 0
    # the same results seen from the other method: the reference is a parameter
    swapped = build_comparison(SPEC, _one_side_wins(+1), {}, {}, reference="coop")
    assert swapped.differences[0].other == "vacsr" and swapped.differences[0].interval.high < 0


def test_zero_shots_one_evaluation_pairs_with_every_seed_of_the_reference(tmp_path):
    results = {"vacsr": HAND_MADE["vacsr"],
               "zero_shot": {"eurosat": _zero_shot(60, 40, seed=42),  # H 48
                             "dtd": _zero_shot(50, 50, seed=None)}}  # H 50
    comparison = build_comparison(SPEC, results, {}, {})
    zero_shot = comparison.differences[1]
    assert zero_shot.other == "zero_shot" and zero_shot.pairing.left_out == 0
    assert zero_shot.pairing.keys == (("eurosat", 1), ("eurosat", 2), ("eurosat", 3),
                                      ("dtd", 1), ("dtd", 2), ("dtd", 3))
    assert list(zero_shot.pairing.differences) == [72 - 48, 70 - 48, 80 - 48,
                                                   48 - 50, 50 - 50, 60 - 50]
    # its rows: one evaluation, no spread, said so instead of a std; an average row all the same
    rows = [r for r in comparison.rows if r["method"] == "zero_shot"]
    assert [r["dataset"] for r in rows] == ["eurosat", "dtd", "average"]
    assert all(r["seeds"] == 1 and r["note"] == SINGLE_EVALUATION for r in rows)
    assert rows[-1]["base"] == 55.0 and rows[-1]["H"] == harmonic_mean(55.0, 45.0)
    text = write_comparison(SPEC, results, {}, {}, tmp_path)[1][0].read_text()
    assert f"| eurosat | zero_shot | 60.00 | 40.00 | 48.00 |  | 0 | {SINGLE_EVALUATION} |" \
        in text
    # a preface (a rehearsal's header) opens the Markdown report alone, written with it
    paths = write_comparison(SPEC, results, {}, {}, tmp_path / "marked", preface="**R**\n\n")[1]
    assert paths[0].read_text() == f"**R**\n\n{text}"
    assert [p.read_text() for p in paths[1:]] == [
        (tmp_path / p.name).read_text() for p in paths[1:]]


def test_failed_methods_and_datasets_are_reported_and_their_seeds_counted_as_left_out(
        tmp_path):
    results = {"vacsr": {**HAND_MADE["vacsr"]},
               "coop": {"eurosat": HAND_MADE["coop"]["eurosat"],
                        "sun397": _result([(70, 60), (71, 61), (72, 62)])},
               "zero_shot": {"eurosat": _zero_shot(60, 40), "sun397": _zero_shot(55, 45)}}
    failed = {"vacsr": {"sun397": "none of 8 trial(s) reported val/acc"},
              "coop": {"dtd": "final seed 2: CUDA out of memory"},
              "zero_shot": {"dtd": "the class names file is missing"},
              "clip_adapter": {d: "diverged" for d in ("eurosat", "dtd", "sun397")}}
    folder = tmp_path
    rows, paths, console = write_comparison(SPEC, results, failed, {}, folder)
    text = paths[0].read_text()
    for method, reasons in failed.items():
        for dataset, why in reasons.items():
            assert f"| {dataset} | {method} | FAILED: {why} |" in text
    # zero-shot: dtd's 3 vacsr seeds have no partner, nor sun397's one zero-shot evaluation
    zero_shot = build_comparison(SPEC, results, failed, {}).differences[1]
    assert zero_shot.interval.pairs == 3 and zero_shot.pairing.left_out == 4
    assert zero_shot.pairing.left_out_why == (
        "dtd: zero_shot failed (the class names file is missing)",
        "sun397: vacsr failed (none of 8 trial(s) reported val/acc)")
    assert "4 (dataset, seed) result(s) left out without a partner: dtd: zero_shot failed" \
        in text
    # coop lacks dtd, which vacsr finished: it cannot be ranked on vacsr's datasets, and no
    # other method can be: said, not a crash
    assert "vacsr's H minus that of the best other method on average: not available (no other " \
        "method finished every dataset vacsr finished: coop lacks dtd; zero_shot lacks dtd)" \
        in text
    assert "not available" in console and "3 pairs, 4 left out" in console
    # pairing coop with vacsr directly: eurosat's 3 pairs; dtd and sun397 lose 3 seeds each
    pairing = pair_seeds(results["vacsr"], results["coop"], METRICS, names=("vacsr", "coop"),
                         failed=(failed["vacsr"], failed["coop"]))
    assert [k for k, _ in pairing.keys] == ["eurosat"] * 3 and pairing.left_out == 6
    # every method failed sun397 or not: no method finished every dataset, so no best average
    assert "- average: none: no method finished every dataset" in text


def test_absent_methods_and_a_table_without_h_give_reasons_not_crashes():
    only_coop = build_comparison(SPEC, {"coop": HAND_MADE["coop"]}, {"vacsr": {"dtd": "boom"}},
                                 {})
    assert [d.reason for d in only_coop.differences] == [
        "vacsr failed on every dataset (dtd: boom)", "vacsr failed on every dataset (dtd: boom)"]
    no_zero_shot = build_comparison(SPEC, HAND_MADE, {}, {}).differences[1]
    assert not no_zero_shot.available and no_zero_shot.reason == "zero_shot has no results"
    no_h = {"columns": [["base", "acc"], ["novel", "novel_acc"]], "harmonic": None,
            "published": {}}
    assert {d.reason for d in build_comparison(no_h, HAND_MADE, {}, {}).differences} == {
        "the table has no harmonic mean H to compare"}


def test_per_dataset_and_average_numbers_are_table_pys():
    results = {**_one_side_wins(+1), "zero_shot": {d: _zero_shot(60, 50) for d in
                                                   ("eurosat", "dtd", "oxford_pets", "ucf101")}}
    comparison = build_comparison(SPEC, results, {}, {})
    for method, per_dataset in results.items():
        expected = {r["dataset"]: r for r in table_rows(SPEC, per_dataset)}
        mine = {r["dataset"]: r for r in comparison.rows if r["method"] == method}
        assert mine.keys() == expected.keys()
        for dataset, row in expected.items():
            assert {k: mine[dataset][k] for k in row} == pytest.approx(row, nan_ok=True), \
                (method, dataset)
    eurosat = next(r for r in comparison.rows if r["dataset"] == "eurosat"
                   and r["method"] == "vacsr")
    assert eurosat["H"] == harmonic_mean(eurosat["base"], eurosat["novel"])  # from the averages
    assert comparison.best["eurosat"].startswith("vacsr (") and eurosat["best"]
    assert comparison.best["average"].startswith("vacsr (")


def test_written_files_are_complete(tmp_path):
    results = {**HAND_MADE, "zero_shot": {"eurosat": _zero_shot(60, 40),
                                          "dtd": _zero_shot(50, 50)}}
    failed = {"clip_adapter": {"eurosat": "diverged", "dtd": "diverged"}}
    budget = {m: dict(BUDGET) for m in ("vacsr", "coop", "clip_adapter")}
    budget["zero_shot"] = {"trials": 0, "shots": 16}
    folder = tmp_path
    rows, paths, console = write_comparison(SPEC, results, failed, budget, folder)
    assert [p.name for p in paths] == [COMPARISON_MD, COMPARISON_CSV, COMPARISON_DIFFERENCES_CSV]
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in paths)  # no temps
    with (folder / COMPARISON_CSV).open() as handle:
        written = list(csv.DictReader(handle))
    assert len(written) == len(rows) == 2 * 4 + 4  # datasets x methods, then the averages
    for row, back in zip(rows, written):
        assert (back["dataset"], back["method"]) == (row["dataset"], row["method"])
        for key in ("base", "base_std", "novel", "novel_std", "H", "H_std"):
            assert (back[key] == "") if key not in row else float(back[key]) == row[key]
    assert {w["failed"] for w in written if w["method"] == "clip_adapter" and w["failed"]} \
        == {"diverged"}
    with (folder / COMPARISON_DIFFERENCES_CSV).open() as handle:
        differences = list(csv.DictReader(handle))
    best_other, zero_shot = build_comparison(SPEC, results, failed, budget).differences
    assert [d["other"] for d in differences] == ["coop", "zero_shot"]
    for back, difference in zip(differences, (best_other, zero_shot)):
        assert float(back["observed"]) == difference.interval.observed
        assert (float(back["low"]), float(back["high"])) == (difference.interval.low,
                                                             difference.interval.high)
        assert (int(back["pairs"]), int(back["left_out"]), int(back["resamples"]),
                back["method"]) == (6, 0, 10_000, "BCa")
    text = (folder / COMPARISON_MD).read_text()
    for method in budget:
        assert text.count(f"| {method} |") == 1 + 3  # two datasets, the average, its budget
    assert "| vacsr | 8 | 1, 2, 3 | int:2:10 | 16 | val/acc |" in text
    assert "Every trained method had the same budget." in text
    assert "vacsr's H minus that of coop (the best other method on average): +5.00 points, " \
        f"95% interval [{best_other.interval.low:+.2f}, {best_other.interval.high:+.2f}] " \
        "(paired bootstrap over 6 (dataset, seed) pairs, BCa, B = 10,000 resamples, seed 0); " \
        "no (dataset, seed) pair left out." in text
    lines = console.splitlines()
    assert len(lines) == 1 + 4 + 2 and lines[1].startswith("  vacsr         base 70.83 ± ")
    assert lines[-1].startswith("vacsr - zero_shot (the zero-shot baseline), H: +")
    # what a method trains and searches describes it: shown, never a difference of budget
    described = {m: {**given, "trains": f"{m}'s head", "searched": m} for m, given in
                 budget.items()}
    text = write_comparison(SPEC, results, failed, described, folder)[1][0].read_text()
    assert "Every trained method had the same budget." in text and "coop's head" in text
    budget["coop"] = {**BUDGET, "trials": 4}
    assert "The trained methods' budgets differ in: trials." in write_comparison(
        SPEC, results, failed, budget, folder)[1][0].read_text()


def test_results_it_cannot_read_are_one_line_and_nothing_is_written(tmp_path):
    folder = tmp_path
    broken = {"vacsr": {"eurosat": {"per_seed": [{"seed": 1, "acc": 70.0}]}}}
    with pytest.raises(ConfigError, match=r"^results\['vacsr'\]\['eurosat'\] per_seed\[0\]: "
                                          r"no number for novel_acc; expected seed and acc, "
                                          r"novel_acc$"):
        write_comparison(SPEC, broken, {}, {}, folder)
    twice = {"zero_shot": {"dtd": {"per_seed": [{"seed": 1, "acc": 1.0, "novel_acc": 1.0}] * 2}}}
    with pytest.raises(ConfigError, match="2 per_seed entries; expected one evaluation"):
        write_comparison(SPEC, twice, {}, {}, folder)
    assert list(folder.iterdir()) == []



# ---------------------------------------------------------------- domain generalisation


def test_a_spec_stored_before_kinds_declared_a_comparison_compares_by_h():
    b2n = table_spec(BASE2NOVEL.table)
    assert b2n["comparison"]["score"] == "H"
    older = {k: v for k, v in b2n.items() if k != "comparison"}
    assert build_comparison(older, HAND_MADE, {}, {}) == build_comparison(b2n, HAND_MADE, {}, {})
