"""What `--methods` plans before Ray starts (vacsr/sweep/plan/methods.py): a unit per dataset
and method, each with its method's values and space under the one budget; VACSR alone keeps the
sweep it always was; the cost plan adds each method's device time."""
from __future__ import annotations

import pytest

from conftest import sweep_plan
from sweeps.base2novel import SWEEP as BASE2NOVEL
from sweeps.retrieval import SWEEP as RETRIEVAL
from vacsr.config import flatten
from vacsr.methods.method import FROZEN_CLIP, SHARED_KEYS
from vacsr.sweep.cost.sweep_cost import format_sweep_cost


def _plan(tmp_path, monkeypatch, *argv):
    return sweep_plan(BASE2NOVEL, tmp_path / "store", ["--datasets", "eurosat,dtd", *argv],
                      monkeypatch=monkeypatch)


def test_vacsr_alone_keeps_its_units_and_space(tmp_path, monkeypatch):
    plan = _plan(tmp_path, monkeypatch)
    again = _plan(tmp_path, monkeypatch, "--methods", "vacsr")
    assert plan.datasets == again.datasets == ["eurosat", "dtd"]
    assert plan.spaces == again.spaces
    assert set(BASE2NOVEL.space) <= set(plan.spaces["eurosat"])
    assert plan.methods == ("vacsr",) and plan.trials_of("dtd") == plan.trials


def test_each_method_is_a_unit_with_its_own_values_and_the_shared_budget(tmp_path, monkeypatch):
    plan = _plan(tmp_path, monkeypatch, "--methods", "all", "--seeds", "1,2,3", "--trials", "5")
    names = ("vacsr", "sigmoid_baseline", "zero_shot", "linear_probe", "clip_adapter", "coop",
             "cocoop", "mma", "maple")
    assert plan.methods == names
    assert plan.datasets == [f"{d}.{m}" for m in names for d in ("eurosat", "dtd")]
    for unit in plan.datasets:
        dataset, method = unit.split(".")
        assert (plan.dataset_of(unit), plan.method_of(unit)) == (dataset, method)
        values = flatten(plan.configs[unit])
        assert values["adapter.kind"] == method
        # a dataset's units share its prefix cache: frozen features computed once per dataset
        assert values["data.prefix_cache_dir"] == flatten(
            plan.configs[f"{dataset}.vacsr"])["data.prefix_cache_dir"]
        if method not in ("vacsr", "sigmoid_baseline"):  # deep methods' images run the towers
            assert all(values[k] == v for k, v in FROZEN_CLIP.items() if k != "train.epochs"
                       and not (method in ("mma", "maple") and k == "data.augment"))
    spaces = {m: plan.spaces[f"eurosat.{m}"] for m in names}
    assert spaces["zero_shot"] == {} and plan.trials_of("eurosat.zero_shot") == 1
    assert plan.seeds_of("eurosat.zero_shot") == (1,) and plan.seeds_of("dtd.coop") == (1, 2, 3)
    for method in ("linear_probe", "clip_adapter", "coop", "cocoop", "mma", "maple"):
        # the budget every one shares
        shared = {k: spaces[method][k] for k in SHARED_KEYS if k in spaces[method]}
        assert shared == {k: spaces["vacsr"][k] for k in SHARED_KEYS}, method
        assert not {k for k in spaces[method] if k.startswith(("loss.", "model."))}, method
    for method in ("coop", "cocoop", "maple"):  # the context's init, and its length if random
        assert set(spaces[method]) - set(SHARED_KEYS) == {"adapter.context_tokens",
                                                          "adapter.context_init"}, method
    assert set(spaces["clip_adapter"]) - set(SHARED_KEYS) == {"adapter.residual_ratio"}
    # the sigmoid baseline searches the blocks and the shared keys, none of VACSR's own
    assert "loss.beta" in spaces["vacsr"] and "adapter.num_components" in spaces["vacsr"]
    assert not {k for k in spaces["sigmoid_baseline"] if k.startswith(("loss.", "adapter."))}
    assert "model.trainable_image_blocks" in spaces["sigmoid_baseline"]


def test_all_on_retrieval_runs_the_four_retrieval_methods(tmp_path, monkeypatch):
    plan = sweep_plan(RETRIEVAL, tmp_path / "store", ["--methods", "all", "--seeds", "1,2",
                                                      "--set", "data.noise_ratio=0.4"],
                      monkeypatch=monkeypatch)
    names = ("vacsr", "sigmoid_baseline", "zero_shot", "clip_contrastive")
    assert plan.methods == names and plan.datasets == [f"coco.{m}" for m in names]
    configs = {m: flatten(plan.configs[f"coco.{m}"]) for m in names}
    spaces = {m: plan.spaces[f"coco.{m}"] for m in names}
    assert all(c["data.noise_ratio"] == 0.4 and c["adapter.kind"] == m
               for m, c in configs.items())
    # zero-shot: one evaluation of the frozen CLIP, whatever the retrieval protocol's epochs
    assert spaces["zero_shot"] == {} and plan.trials_of("coco.zero_shot") == 1
    assert plan.seeds_of("coco.zero_shot") == (1,) and configs["zero_shot"]["train.epochs"] == 1
    assert all(configs["zero_shot"][k] == v for k, v in FROZEN_CLIP.items())
    # CLIP's contrastive fine-tuning: the sigmoid baseline's blocks, lr multiplier and protocol,
    # none of VACSR's adapter and loss keys
    assert spaces["clip_contrastive"] == spaces["sigmoid_baseline"]
    assert "optim.backbone_lr_mult" in spaces["clip_contrastive"]
    assert not {k for k in spaces["clip_contrastive"] if k.startswith(("loss.", "adapter."))}
    assert "loss.beta" in spaces["vacsr"]
    assert plan.seeds_of("coco.clip_contrastive") == (1, 2)
    for key in RETRIEVAL.protocol:  # the kind's (train.epochs as the embedded profile sets it)
        assert configs["clip_contrastive"][key] == configs["vacsr"][key], key
    assert configs["clip_contrastive"]["optim.lr"] == RETRIEVAL.protocol["optim.lr"]
    assert {k: v for k, v in configs["clip_contrastive"].items() if not k.startswith("adapter.")
            } == {k: v for k, v in configs["sigmoid_baseline"].items()
                  if not k.startswith("adapter.")}


def test_the_epochs_a_user_sets_hold_for_every_trained_method(tmp_path, monkeypatch, capsys):
    plan = _plan(tmp_path, monkeypatch, "--methods", "vacsr,zero_shot,linear_probe", "--epochs",
                 "3")
    # the one method it does not reach is named, not passed over in silence
    assert ("--set train.epochs=3 does not reach zero_shot, which keeps train.epochs=1: it "
            "trains nothing (one evaluation per dataset)") in capsys.readouterr().out
    assert plan.configs["eurosat.vacsr"].train.epochs == 3
    assert plan.configs["eurosat.linear_probe"].train.epochs == 3
    assert "train.epochs" not in plan.spaces["eurosat.linear_probe"]
    assert plan.configs["eurosat.zero_shot"].train.epochs == 1  # its one evaluation


def test_coops_count_of_random_vectors_is_drawn_under_a_random_init_alone(tmp_path,
                                                                         monkeypatch):
    """Under a phrase init the phrase sets M, so a drawn count would vary nothing: the count is
    drawn only with a random init; a --set init decides it for every trial (always drawn, or
    not searched), and a --range on the count keeps its condition."""
    import optuna

    from vacsr.config.domains import Choice
    from vacsr.model.prompt_room import COUNT_KEY, INIT_KEY, RANDOM_INIT
    from vacsr.sweep.spec.space import DefineByRun

    space = _plan(tmp_path, monkeypatch, "--methods", "coop").spaces["eurosat"]
    assert space[COUNT_KEY] == Choice((4, 8), when=(INIT_KEY, RANDOM_INIT))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    study.optimize(lambda trial: DefineByRun(space)(trial) or 0.0, n_trials=24)
    for trial in study.trials:
        assert (COUNT_KEY in trial.params) == (trial.params[INIT_KEY] == RANDOM_INIT), trial.params
    assert {t.params[INIT_KEY] for t in study.trials} == {RANDOM_INIT, "a photo of a"}

    phrase = _plan(tmp_path, monkeypatch, "--methods", "coop", "--set",
                   "adapter.context_init=a photo of a").spaces["eurosat"]
    assert INIT_KEY not in phrase and COUNT_KEY not in phrase
    random = _plan(tmp_path, monkeypatch, "--methods", "coop", "--set",
                   f"adapter.context_init={RANDOM_INIT}").spaces["eurosat"]
    assert random[COUNT_KEY] == Choice((4, 8))  # every trial draws it now
    ranged = _plan(tmp_path, monkeypatch, "--methods", "coop", "--range",
                   f"{COUNT_KEY}=choice:4,8,12").spaces["eurosat"]
    assert ranged[COUNT_KEY] == Choice((4, 8, 12), when=(INIT_KEY, RANDOM_INIT))


def test_an_init_phrase_takes_the_prompt_room_its_tokens_take(tmp_path, monkeypatch):
    """The plan counts a CoOp init phrase with the model's tokenizer, as the model's build does
    (vacsr/model/prompt_room.py): 13 tokens fit the tiny CLIP's 16 text positions, 14 do not."""
    from vacsr.errors import ConfigError
    from vacsr.model.prompt_room import context_size

    fits = "a b c d e f g h i j k l m"
    assert context_size(4, fits, "vacsr-tiny") == 13
    plan = _plan(tmp_path, monkeypatch, "--methods", "coop", "--set",
                 f"adapter.context_init={fits}")
    assert plan.configs["dtd"].adapter.context_init == fits
    with pytest.raises(ConfigError, match=r"^adapter.context_init: eurosat's coop runs can take "
                                          r"'a b c d e f g h i j k l m n', which is 14 tokens"):
        _plan(tmp_path, monkeypatch, "--methods", "coop", "--set",
              f"adapter.context_init={fits} n")


REAL_NAMES = ("Annual Crop Land", "2012 Mercedes-Benz SL-Class Coupe", "F/A-18", "Cessna 172",
              "yellow lady's slipper", "grand piano", "indoor apse", "Apply Eye Makeup")


def test_word_pieces_count_a_names_tokens_without_the_tokenizer():
    """The plan counts a class name's tokens without open_clip (its driver imports no torch):
    exactly for names of common words, within two tokens for every generated dataset's longest
    name (rare words merged into more tokens), never more than the tokenizer's."""
    from vacsr.data.generate import NAMING, synthetic_classnames
    from vacsr.model.backbone import model_tokenizer
    from vacsr.model.prompt_room import word_pieces

    tokenizer = model_tokenizer("ViT-B-16")

    def tokens(names):  # the tokens between <SOT> and <EOT>
        return (tokenizer(list(names)).argmax(dim=-1) - 1).tolist()

    assert [word_pieces(name) for name in REAL_NAMES] == tokens(REAL_NAMES)
    for dataset in (*NAMING, "fgvc_aircraft", "imagenet"):
        names = [name.replace("_", " ") for name in synthetic_classnames(dataset)]
        counted, true = [word_pieces(name) for name in names], tokens(names)
        assert max(true) - 2 <= max(counted) <= max(true), dataset


@pytest.mark.parametrize("method", ["coop", "cocoop", "maple"])
def test_a_prompt_methods_plan_charges_the_text_tower_up_to_its_longest_prompt(
        method, tmp_path, monkeypatch):
    """A prompt method's prompts run up to the longest one's <EOT> (vacsr/model/prefix.py
    prompt_end): the plan's share of the context is the longest prompt any context its space
    draws writes for the unit's class names, as the tiny CLIP's tokenizer counts it, to a token."""
    from vacsr.data.generate import synthetic_classnames
    from vacsr.model.backbone import model_tokenizer
    from vacsr.model.prompt_room import RANDOM_INIT
    from vacsr.sweep.cost.counts import DatasetCounts, name_pieces
    from vacsr.sweep.cost.sweep_cost import with_prompt_share

    plan = _plan(tmp_path, monkeypatch, "--methods", method)
    unit = next(u for u in plan.datasets if plan.dataset_of(u) == "eurosat")
    base_labels = set(range(5))  # base-to-novel trains on the first half of the 10 classes
    names = [synthetic_classnames("eurosat")[label] for label in sorted(base_labels)]
    counts = DatasetCounts(train=10, val=5, test=5, prompts=5,
                           name_pieces=name_pieces(synthetic_classnames("eurosat"), base_labels))
    share = with_prompt_share(plan, unit, counts).prompt_share
    flat, space = flatten(plan.configs[unit]), plan.spaces[unit]
    inits = space["adapter.context_init"].options if "adapter.context_init" in space \
        else (flat["adapter.context_init"],)
    sizes = space["adapter.context_tokens"].options if "adapter.context_tokens" in space \
        else (flat["adapter.context_tokens"],)
    tokenizer = model_tokenizer("vacsr-tiny")
    longest = 0
    for init in inits:
        words = [" ".join(["X"] * m) if init == RANDOM_INIT else init for m in sizes]
        prompts = [f"{w} {name.replace('_', ' ')}." for w in words for name in names]
        longest = max(longest, int(tokenizer(prompts).argmax(dim=-1).max()) + 1)
    assert abs(share * 16 - longest) <= 1 and share < 1


def test_the_cost_plan_adds_each_methods_device_time():
    row = {"train": 8, "val": 4, "test": 4, "evaluations": {"novel_acc": 4},
           "steps_per_epoch": [2], "trials": 2, "epochs": [1, 2], "trial_s": 1.0,
           "final_s": 5.0, "peak_gib": 0.1}
    cost = {"sweep": "s", "kind": "base2novel", "model": "vacsr-tiny",
            "measured_on": {"device": "cpu"}, "resources": {"CPU": 2}, "parallel_datasets": 1,
            "concurrent_trials": 1,
            "datasets": [{**row, "dataset": "a.vacsr", "method": "vacsr", "search_s": 100.0},
                         {**row, "dataset": "b.vacsr", "method": "vacsr", "search_s": 20.0},
                         {**row, "dataset": "a.coop", "method": "coop", "search_s": 30.0}],
            "totals": {"search_device_s": 150.0, "search_no_stop_device_s": 200.0,
                       "final_device_s": 15.0, "wall_s": 165.0, "wall_no_stop_s": 215.0}}
    text = format_sweep_cost(cost)
    assert "per method: vacsr 2 min 00 s + 10 s final; coop 30 s + 5 s final" in text
    one = {**cost, "datasets": cost["datasets"][:2]}
    assert "per method" not in format_sweep_cost(one)
    # the first column fits the longest unit name: every row's numbers line up with the header
    long = {**cost, "datasets": [*cost["datasets"], {**row, "dataset": "imagenet.sigmoid_baseline",
                                                     "method": "sigmoid_baseline",
                                                     "search_s": 1.0}]}
    lines = format_sweep_cost(long).splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("dataset "))
    table = lines[header:header + 5]
    assert table[-1].startswith("imagenet.sigmoid_baseline  ")
    assert {len(line) for line in table} == {len(table[0])}  # no name pushes its row out


def test_the_comparison_budget_carries_the_setting_the_kind_names(tmp_path, monkeypatch):
    """The retrieval comparison's header names the noise ratio: each method's budget carries
    its config's; a kind that names none (base-to-novel) gets no such entry."""
    from sweeps.retrieval import SWEEP as RETRIEVAL
    from vacsr.sweep.report.methods_report import method_budget

    plan = sweep_plan(RETRIEVAL, tmp_path / "ret", ["--methods", "vacsr,sigmoid_baseline",
                                                    "--set", "data.noise_ratio=0.2"],
                      monkeypatch=monkeypatch)
    assert [method_budget(plan, u)["data.noise_ratio"] for u in plan.datasets] == [0.2, 0.2]
    b2n = _plan(tmp_path, monkeypatch, "--methods", "vacsr,coop")
    assert "data.noise_ratio" not in method_budget(b2n, "eurosat.vacsr")


@pytest.mark.parametrize("phrase", ["a photo of a", "a centered satellite photo of",
                                    "ÉTÉ naïve café", "x-ray, (close-up) 3d", "İstanbul"])
def test_a_phrase_has_at_most_a_token_per_byte_so_short_ones_fit_uncounted(phrase):
    """The bound that spares a sweep's driver the tokenizer (and torch) for a short phrase holds
    against CLIP's own tokenizer."""
    from vacsr.model.prompt_room import context_size, fits_uncounted

    assert context_size(4, phrase, "vacsr-tiny") <= len(phrase.lower().encode())
    assert fits_uncounted("a photo of a", "vacsr-tiny", 16)  # CoOp's default init
    assert not fits_uncounted("a b c d e f g h i j k l m", "vacsr-tiny", 16)


def test_the_memory_check_follows_what_a_method_keeps_for_its_backward(tmp_path, monkeypatch):
    """A step's peak (vacsr/sweep/cost/memory.py) by method, at the space's largest batch: a
    frozen method keeps no activations; CoOp keeps its C prompts' through the whole text tower
    (its gradient reaches the context at the input); CoCoOp every image's C prompts'."""
    from vacsr.sweep.cost.memory import worst_memory

    plan = _plan(tmp_path, monkeypatch, "--methods", "linear_probe,coop,cocoop")
    peaks = {m: worst_memory(plan, f"dtd.{m}")[2] for m in ("linear_probe", "coop", "cocoop")}
    assert peaks["linear_probe"] < peaks["coop"] < peaks["cocoop"], peaks
    batch = max(plan.spaces["dtd.cocoop"]["train.batch_size"].options)
    # CoCoOp's text activations are its batch's times CoOp's: the growth is at least half that
    # (the weights and the images' share do not grow)
    grown = (peaks["cocoop"] - peaks["linear_probe"]) / (peaks["coop"] - peaks["linear_probe"])
    assert grown >= batch / 2, (grown, batch)
