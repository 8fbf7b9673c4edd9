"""Sweep pieces that need no cluster: spaces, argument checks, val-only selection."""
import pytest

from vacsr.errors import ConfigError
from vacsr.sweep.driver import select_best
from vacsr.sweep.space import (BATCH_SIZES, Choice, Int, LogFloat, parse_range, space_for,
                               validate_space)


def test_space_keys_are_config_keys_and_batch_sizes_follow_the_dataset():
    space = space_for("base2novel", "eurosat")
    assert space["train.batch_size"] == Choice(BATCH_SIZES["eurosat"])
    assert space_for("base2novel", "sun397")["train.batch_size"].options[-1] == 128
    assert space["loss.alpha_kl"] == LogFloat(1e-5, 1e-2)
    assert space["adapter.num_components"] == Choice((1, 2, 3, 4))
    assert space["loss.num_hard_negatives"] == Choice((1, 2, 4, 8))
    with pytest.raises(ConfigError, match="loss.betta"):
        validate_space({"loss.betta": LogFloat(0.1, 1.0)})


@pytest.mark.parametrize("text, fragment", [
    ("loss.beta=log:2:1", "inverted"), ("loss.beta=log:1:1", "inverted"),
    ("train.epochs=int:5:2", "inverted"), ("adapter.num_components=choice:", "empty"),
    ("loss.beta=log:0:1", "low > 0"),
])
def test_empty_or_inverted_ranges_are_rejected(text, fragment):
    key, domain = parse_range(text)
    with pytest.raises(ConfigError, match=fragment):
        space_for("base2novel", "dtd", {key: domain})


def test_parse_range_forms():
    assert parse_range("loss.beta=log:0.5:2") == ("loss.beta", LogFloat(0.5, 2.0))
    assert parse_range("train.epochs=int:1:3") == ("train.epochs", Int(1, 3))
    assert parse_range("adapter.num_components=choice:1,2") == ("adapter.num_components",
                                                               Choice((1, 2)))
    with pytest.raises(ConfigError, match="expected key=log"):
        parse_range("loss.beta=0.5")


def test_selection_uses_val_metrics_only():
    trials = [
        {"config": "a", "metrics": {"val/acc": 70.0, "test/acc": 95.0}},  # best test, not val
        {"config": "b", "metrics": {"val/acc": 80.0, "test/acc": 60.0}},
        {"config": "c", "metrics": {"val/acc": 80.0, "test/acc": 90.0}},  # ties b: later loses
        {"config": "d", "metrics": {"test/acc": 99.0}},  # never reported val
    ]
    assert select_best(trials, "val/acc")["config"] == "b"
    assert select_best(trials, "val/acc", mode="min")["config"] == "a"
    with pytest.raises(ValueError, match="val metric"):
        select_best(trials, "test/acc")


def _spec(argv, tmp_path):
    from vacsr.sweep.cli import build_parser, spec_from_args

    args = build_parser("base2novel").parse_args(argv + ["--storage", str(tmp_path)])
    return spec_from_args("base2novel", args)


def test_bad_input_fails_before_any_trial(tmp_path):
    with pytest.raises(ConfigError, match="unknown dataset 'mnist'"):
        _spec(["--datasets", "eurosat,mnist"], tmp_path)
    with pytest.raises(ConfigError, match="inverted"):
        _spec(["--datasets", "eurosat", "--range", "loss.gamma=log:5:1"], tmp_path)
    with pytest.raises(ConfigError, match="127.0.0.1:9"):
        _spec(["--datasets", "eurosat", "--tracking-uri", "http://127.0.0.1:9"], tmp_path)
    with pytest.raises(ConfigError, match="loss.gamma"):
        _spec(["--datasets", "eurosat", "--data-root", str(tmp_path), "--set", "loss.gamma=-1"],
              tmp_path)
    assert not (tmp_path / "base2novel" / "tune").exists()  # nothing started
