"""A bad `--methods` choice, or a --set or --range the choice contradicts, is refused before Ray
starts (vacsr/sweep/plan/methods.py): one line `vacsr: error: ...`, exit status 2, nothing
written. A plan that passes where it should not fails the test at once, before any sweep runs."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import make_dataset_folders
from sweeps.retrieval import SWEEP as RETRIEVAL
from tests.support.sweep_refusals import sweep_refused, written_besides

LONG_PHRASE = "a b c d e f g h i j k l m n o p q r s t"  # 20 tokens of CLIP's BPE


@pytest.fixture
def data_root(tmp_path) -> Path:
    return make_dataset_folders(tmp_path / "data")


@pytest.fixture(autouse=True)
def _no_sweep(monkeypatch):
    """The refusal must come from the plan: a sweep that would start fails here instead."""
    from vacsr.sweep.flow import driver

    def planned(plan):
        raise AssertionError(f"the plan of {', '.join(plan.datasets)} passed; expected a refusal")

    monkeypatch.setattr(driver, "run_sweep", planned)


@pytest.mark.parametrize("argv,fragment", [
    (["--methods", "vacsr,tip_adapter"], "--methods: unknown method 'tip_adapter'; the methods "
                                         "are vacsr, sigmoid_baseline, zero_shot, linear_probe, "
                                         "clip_adapter, coop, cocoop, mma, maple, "
                                         "clip_contrastive (or all)"),
    (["--methods", "coop,vacsr,coop"], "--methods: coop named twice; name each once"),
    (["--methods", "all,vacsr"], "--methods: 'all' stands alone; give either all or a list of "
                                 "methods"),
    (["--methods", "vacsr,clip_contrastive"], "--methods: clip_contrastive runs on retrieval "
                                              "only, not the base2novel sweep's classification"),
    (["--methods", "vacsr", "--set", "adapter.residual_ratio=0.5"],
     "--set adapter.residual_ratio: only clip_adapter read it, and --methods runs vacsr"),
    (["--methods", "vacsr,linear_probe", "--set", "model.trainable_image_blocks=1"],
     "--set model.trainable_image_blocks=1: linear_probe fixes it at 0"),
    (["--methods", "vacsr,linear_probe", "--set", "data.augment=true"],
     "--set data.augment=true: linear_probe fixes it at false"),
    # the method each unit runs is the one --methods gives it, never a --set's or a --range's
    (["--set", "adapter.kind=coop"],
     "--set adapter.kind=coop: the method is chosen with --methods (--methods coop)"),
    (["--methods", "vacsr,coop", "--set", "adapter.kind=vacsr"],
     "--set adapter.kind=vacsr: the method is chosen with --methods (--methods vacsr)"),
    (["--range", "adapter.kind=choice:vacsr,coop"],
     "--range adapter.kind: the method is chosen with --methods (--methods vacsr,coop)"),
    (["--methods", "zero_shot,linear_probe", "--range", "loss.beta=log:0.5:2"],
     "--range loss.beta: none of zero_shot, linear_probe searches it (searched by vacsr)"),
    (["--methods", "coop", "--range", "adapter.context_tokens=choice:4,14"],
     "adapter.context_tokens: eurosat's coop runs can take 14, which leaves no room for a class "
     "name in vacsr-tiny's 16 text positions; expected at most 13"),
    # an init phrase takes as many positions as it has tokens, whatever adapter.context_tokens
    (["--methods", "vacsr,coop", "--set", f"adapter.context_init={LONG_PHRASE}"],
     f"adapter.context_init: eurosat's coop runs can take {LONG_PHRASE!r}, which is 20 tokens "
     "and leaves no room for a class name in vacsr-tiny's 16 text positions; expected a phrase "
     "of at most 13 tokens"),
    (["--methods", "coop", "--range",
      "adapter.context_init=choice:random,a photo of a,a b c d e f g h i j k l m n"],
     "adapter.context_init: eurosat's coop runs can take 'a b c d e f g h i j k l m n', which "
     "is 14 tokens"),
    (["--methods", "vacsr", "--range", "adapter.context_tokens=choice:4,8"],
     "--range adapter.context_tokens: none of vacsr searches it (searched by coop, cocoop, "
     "maple)"),
])
def test_a_bad_method_choice_is_one_line_before_ray(tmp_path, capsys, data_root, argv,
                                                     fragment):
    line = sweep_refused(["--datasets", "eurosat", "--data-root", str(data_root), *argv],
                         tmp_path / "store", capsys)
    assert fragment in line, line
    assert written_besides(tmp_path, data_root) == []


@pytest.mark.parametrize("argv,fragment", [
    (["--methods", "clip_contrastive", "--set", "adapter.num_components=3"],
     "--set adapter.num_components: only vacsr read it, and --methods runs clip_contrastive"),
    (["--methods", "clip_contrastive", "--range", "loss.gamma=log:0.5:2"],
     "--range loss.gamma: none of clip_contrastive searches it (searched by vacsr)"),
    (["--methods", "clip_contrastive,coop"], "--methods: coop runs on classification only, not "
                                             "the retrieval sweep's retrieval"),
])
def test_a_bad_retrieval_method_choice_is_one_line_before_ray(tmp_path, capsys, data_root, argv,
                                                               fragment):
    line = sweep_refused(["--data-root", str(data_root), *argv], tmp_path / "store", capsys,
                         kind=RETRIEVAL)
    assert fragment in line, line
    assert written_besides(tmp_path, data_root) == []
