"""The comparison by the shapes other kinds declare (vacsr/sweep/spec/kind.py Compared): domain
generalisation a row per target with the shifted average and a difference per target, retrieval
by RSUM with the noise ratio named, and the declared shape surviving the stored spec."""
from __future__ import annotations

import csv
import json
import random
from statistics import mean, pstdev

import pytest

from sweeps.domain_generalization import SWEEP as DG
from sweeps.retrieval import SWEEP as RETRIEVAL
from vacsr.results import table_spec
from vacsr.sweep.plan.folders import COMPARISON_CSV, COMPARISON_DIFFERENCES_CSV, COMPARISON_MD
from vacsr.sweep.report.comparison import build_comparison, write_comparison
from vacsr.sweep.spec.kind import Compared

DG_SPEC = table_spec(DG.table)
SHIFTED = ("imagenetv2", "imagenet_sketch", "imagenet_a", "imagenet_r")
TARGETS = (("imagenet", "acc"), *((s, f"{s}_acc") for s in SHIFTED))


def _dg_result(values: dict[str, list[float]], seeds=(1, 2, 3)) -> dict:
    """values[target] = one accuracy per seed; ood_avg_acc as the sweep computes it."""
    per_seed = []
    for i, s in enumerate(seeds):
        entry = {"seed": s, **{metric: float(values[t][i]) for t, metric in TARGETS}}
        entry["ood_avg_acc"] = mean(entry[f"{t}_acc"] for t in SHIFTED)
        per_seed.append({**entry, "eval_seconds": 0.3})
    return {"val": 61.0, "num_trials": 2, "per_seed": per_seed}


def _dg_results() -> dict[str, dict]:
    """vacsr, coop (the best other on the shifted average), linear_probe (the best on ImageNet
    itself, weak on the shifts) and zero-shot's one evaluation; whole numbers, seeded."""
    rng = random.Random(11)

    def draw(low: int, high: int) -> dict[str, list[float]]:
        return {t: [rng.randint(low, high) for _ in range(3)] for t, _ in TARGETS}

    # over all five rows the probe would lead coop ((99 + 4 x ~32) / 5 > ~40): over the shifts
    # coop does
    probe = draw(30, 34)
    probe["imagenet"] = [98, 99, 100]
    return {"vacsr": {"imagenet": _dg_result(draw(50, 70))},
            "coop": {"imagenet": _dg_result(draw(35, 45))},
            "linear_probe": {"imagenet": _dg_result(probe)},
            "zero_shot": {"imagenet": _dg_result({t: [rng.randint(30, 50)] for t, _ in TARGETS},
                                                 seeds=(0,))}}


def test_domain_generalisation_rows_are_per_target_with_the_shifted_average(tmp_path):
    results = _dg_results()
    comparison = build_comparison(DG_SPEC, results, {}, {})
    methods = list(results)
    names = [t for t, _ in TARGETS] + ["shifted average"]
    assert [(r["target"], r["method"]) for r in comparison.rows] == [
        (t, m) for t in names[:-1] for m in methods] + [("shifted average", m) for m in methods]
    for row in comparison.rows:
        per_seed = results[row["method"]]["imagenet"]["per_seed"]
        if row["target"] == "shifted average":  # the mean over seeds of ood_avg_acc
            values = [e["ood_avg_acc"] for e in per_seed]
            assert row["targets"] == 4
        else:
            values = [e[dict(TARGETS)[row["target"]]] for e in per_seed]
        assert row["accuracy"] == pytest.approx(mean(values), abs=1e-9), row
        assert row["accuracy_std"] == pytest.approx(pstdev(values), abs=1e-9), row
    # the best other is the best on the shifts' average, not on ImageNet (the linear probe's)
    assert comparison.best["imagenet"].startswith("linear_probe (99.00)")
    assert comparison.best["shifted average"].startswith("vacsr (")
    assert comparison.differences[0].other == "coop"
    found = {(d.target, d.other): d for d in comparison.differences}
    assert len(comparison.differences) == 2 * 6
    assert {d.label for d in comparison.differences} == {
        "the best other method on the shifted average", "the zero-shot baseline"}
    vacsr, coop = (results[m]["imagenet"]["per_seed"] for m in ("vacsr", "coop"))
    zero_shot = results["zero_shot"]["imagenet"]["per_seed"][0]
    for target, metric in TARGETS:  # over the target's 3 seeds
        by_seed = [a[metric] - b[metric] for a, b in zip(vacsr, coop)]
        assert list(found[target, "coop"].pairing.differences) == by_seed
        assert found[target, "coop"].interval.observed == pytest.approx(mean(by_seed))
        assert list(found[target, "zero_shot"].pairing.differences) == [
            a[metric] - zero_shot[metric] for a in vacsr]  # one evaluation, every seed
    # the shifted average: over the 4 x 3 (target, seed) pairs, its mean the rows' difference
    average = found["shifted average", "coop"]
    assert average.interval.pairs == 12 and average.pairing.left_out == 0
    rows = {(r["target"], r["method"]): r for r in comparison.rows}
    assert average.interval.observed == pytest.approx(
        rows["shifted average", "vacsr"]["accuracy"] - rows["shifted average", "coop"]["accuracy"])
    assert found["shifted average", "zero_shot"].interval.pairs == 12

    write_comparison(DG_SPEC, results, {"clip_adapter": {"imagenet": "diverged"}}, {}, tmp_path)
    written = list(csv.DictReader((tmp_path / COMPARISON_CSV).open()))
    assert {(w["target"], w["method"]) for w in written} == {
        (t, m) for t in names for m in [*methods, "clip_adapter"]}
    assert {w["failed"] for w in written if w["method"] == "clip_adapter"} == {"diverged", ""}
    differences = list(csv.DictReader((tmp_path / COMPARISON_DIFFERENCES_CSV).open()))
    assert [(d["target"], d["other"]) for d in differences] == [
        (t, o) for t in names for o in ("coop", "zero_shot")]
    text = (tmp_path / COMPARISON_MD).read_text()
    assert "| shifted average (4 target(s)) | vacsr | **" not in text  # bold: per target only
    assert "| imagenet | linear_probe | **99.00 ± 0.82** | 61.00 | 2 | 3 |" in text
    assert "| imagenet_a | clip_adapter | FAILED: diverged |" in text
    assert "vacsr's accuracy on the shifted average minus that of coop (the best other method " \
        "on the shifted average): " in text
    assert "over 12 (target, seed) pairs" in text and "over 3 seeds" in text


def test_an_unfinished_unit_is_a_note_on_each_of_its_targets_and_withholds_the_best():
    """A stopped sweep's unit (vacsr best --compare: vacsr/sweep/report/unfinished.py) has no
    result yet: each of its target rows says so, and no best method or difference is named."""
    results = _dg_results()
    del results["coop"]
    unfinished = {"coop": {"imagenet": "unfinished (run KILLED)"}}
    comparison = build_comparison(DG_SPEC, results, {}, {}, unfinished=unfinished)
    rows = {(r["target"], r["method"]): r for r in comparison.rows}
    for target, _ in TARGETS:
        assert rows[target, "coop"]["note"] == "unfinished (run KILLED)"
        assert "best" not in rows[target, "vacsr"]
    assert set(comparison.best.values()) == {"none: the sweep is unfinished"}
    assert len(comparison.best) == len(TARGETS) + 1
    assert {(d.interval, d.reason) for d in comparison.differences} == {
        (None, "the sweep is unfinished")}


def test_a_constant_difference_has_a_zero_width_interval_per_target_and_on_average():
    """The bootstrap pairs a method's seed with the other's same seed (and target): a difference
    that is the same on every pair has no spread, however much the seeds themselves vary."""
    rng = random.Random(5)
    coop = {t: [rng.randint(20, 80) for _ in range(3)] for t, _ in TARGETS}
    results = {"vacsr": {"imagenet": _dg_result({t: [v + 2 for v in coop[t]] for t in coop})},
               "coop": {"imagenet": _dg_result(coop)}}
    for difference in build_comparison(DG_SPEC, results, {}, {}).differences[::2]:
        i = difference.interval
        assert difference.other == "coop" and (i.low, i.observed, i.high) == (2.0, 2.0, 2.0)
    spread = [pstdev(v) for v in coop.values()]
    assert min(spread) > 2  # an unpaired interval would be wide


# ---------------------------------------------------------------- retrieval

RETRIEVAL_SPEC = table_spec(RETRIEVAL.table)


def _retrieval(rsum: list[float], eccv: bool, seeds=(1, 2, 3)) -> dict:
    per_seed = []
    for s, value in zip(seeds, rsum):
        entry = {"seed": s, "rsum": float(value), "i2t_r1": value / 6 + 1, "t2i_r1": value / 6 - 1,
                 "i2t_r5": 1.0}
        if eccv:
            entry.update(eccv_map_at_r_i2t=value / 10, eccv_map_at_r_t2i=value / 12)
        per_seed.append(entry)
    return {"val": 300.0, "num_trials": 2, "per_seed": per_seed}


def test_retrieval_rows_compare_rsum_and_name_the_noise_ratio(tmp_path):
    results = {"vacsr": {"coco": _retrieval([420, 432, 411], eccv=True)},
               "clip_contrastive": {"coco": _retrieval([418, 430, 409], eccv=False)},
               "zero_shot": {"coco": _retrieval([300], eccv=True, seeds=(0,))}}
    budget = {m: {"trials": 2, "data.noise_ratio": 0.2} for m in results}
    comparison = build_comparison(RETRIEVAL_SPEC, results, {}, budget)
    rows = {(r["dataset"], r["method"]): r for r in comparison.rows}
    vacsr = rows["coco", "vacsr"]
    assert vacsr["RSUM"] == 421.0 and vacsr["R@1 i2t"] == pytest.approx(421 / 6 + 1)
    assert vacsr["ECCV mAP@R i2t"] == pytest.approx(42.1) and vacsr["best"]
    # ECCV Caption where the results have it: not for a method evaluated without COCO's ids
    assert "ECCV mAP@R i2t" not in rows["coco", "clip_contrastive"]
    assert "R@5" not in vacsr and "i2t_r5" not in vacsr  # the declared columns only
    best_other, zero_shot = comparison.differences
    assert best_other.other == "clip_contrastive" and best_other.target is None
    i = best_other.interval  # 2 RSUM on each of the 3 seeds: paired, no spread
    assert (i.low, i.observed, i.high, i.pairs) == (2.0, 2.0, 2.0, 3)
    assert list(zero_shot.pairing.differences) == [120.0, 132.0, 111.0]

    _, paths, console = write_comparison(RETRIEVAL_SPEC, results, {}, budget, tmp_path)
    text = paths[0].read_text()
    assert "\nNoise ratio of the training captions (0 = clean): 0.2 (data.noise_ratio).\n" in text
    assert "| dataset | method | RSUM | R@1 i2t | R@1 t2i | ECCV mAP@R i2t | ECCV mAP@R t2i |" \
        in text
    assert "| coco | clip_contrastive | 419.00 ± 8.60 | 70.83 ± 1.43 | 68.83 ± 1.43 |  |  |" \
        in text
    assert "vacsr's RSUM minus that of clip_contrastive (the best other method on average): " \
        "+2.00 points, 95% interval [+2.00, +2.00]" in text
    assert "Noise ratio of the training captions (0 = clean): 0.2" in console
    unrecorded = write_comparison(RETRIEVAL_SPEC, results, {}, {}, tmp_path)[1][0].read_text()
    assert "Noise ratio of the training captions (0 = clean): not recorded " \
        "(data.noise_ratio)." in unrecorded
    budget["clip_contrastive"]["data.noise_ratio"] = 0.5
    assert "differs between the methods (vacsr 0.2; clip_contrastive 0.5; zero_shot 0.2)" in \
        write_comparison(RETRIEVAL_SPEC, results, {}, budget, tmp_path)[1][0].read_text()


def test_the_comparison_a_kind_declares_survives_the_stored_spec():
    """The spec is logged as JSON on the sweep's run: a report rebuilt from the store reads the
    same comparison; a declaration naming a column it does not have is refused."""
    dg = build_comparison(DG_SPEC, _dg_results(), {}, {})
    stored = build_comparison(json.loads(json.dumps(DG_SPEC)), _dg_results(), {}, {})
    assert stored.rows == dg.rows and stored.differences == dg.differences
    with pytest.raises(ValueError, match="comparison: nope not among its columns"):
        Compared(score="H", columns=(("base", "acc"),), harmonic=("base", "nope"))


def test_a_retrieval_comparison_without_eccv_results_has_no_eccv_columns(tmp_path):
    """ECCV Caption's columns are optional: none where no method was evaluated on COCO's 5K
    test set (a table of empty columns said nothing)."""
    results = {"vacsr": {"coco": _retrieval([420, 432, 411], eccv=False)},
               "zero_shot": {"coco": _retrieval([300], eccv=False, seeds=(0,))}}
    text = write_comparison(RETRIEVAL_SPEC, results, {}, {}, tmp_path)[1][0].read_text()
    assert "| dataset | method | RSUM | R@1 i2t | R@1 t2i | best val |" in text
    assert "ECCV" not in text
