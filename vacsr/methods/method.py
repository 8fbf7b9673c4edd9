"""A few-shot CLIP method as data: what trains, how a batch of features becomes class logits or
pair scores (its head), its loss, what it searches and fixes, and how it scores classes it never
trained on. The registry (vacsr/methods/registry.py) lists them; the trainer, the evaluation and
the sweeps ask a method instead of branching on its name (`adapter.kind` names it in a config).

A method's module is a declaration: it imports torch and open_clip only inside the functions that
build its head and compute its loss (the heads live in vacsr/model/), so a sweep driver reads
every method's space and protocol without the model stack.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping

from vacsr.config import set_value, shown
from vacsr.config.domains import Domain
from vacsr.errors import ConfigError

# the config key naming a run's method; a sweep's --methods sets it for each of its units
METHOD_KEY = "adapter.kind"

# the keys every trained method of a sweep searches alike: the same epoch range, learning rate
# and batch sizes (the equal budget of a comparison)
SHARED_KEYS = ("train.epochs", "optim.lr", "train.batch_size")

# a frozen CLIP (the features open_clip's encode_image / encode_text give): no block, projection
# or embedding trains and the towers pool as CLIP does, so the whole tower is the frozen prefix
# (vacsr/model/frozen.py) and evaluation passes reuse its cached outputs. Unaugmented training
# images: each one's feature is computed once and every epoch trains on it (vacsr/train/loop.py
# Trainer.feature_dataset), as CLAP's and Tip-Adapter's linear probes train on extracted
# features; with augmentation every epoch's new views would each need the tower again
FROZEN_CLIP = {"model.trainable_image_blocks": 0, "model.trainable_text_blocks": 0,
               "model.train_projections": False, "model.train_embeddings": False,
               "model.use_gpo": False, "data.augment": False}
# CLIP frozen whole, but the images go through the towers every step (a deep method acts inside
# them, vacsr/model/tower_hooks.py): the sweep's augmentation stays
FROZEN_TOWERS = {key: value for key, value in FROZEN_CLIP.items() if key != "data.augment"}

# (head, image features (B, d), class or caption features (B', d), labels (B, B'), the loss
# config) -> (loss, dict of named parts)
LossFn = Callable[[Any, Any, Any, Any, Any], tuple[Any, dict]]


def keep(head, data=None):
    """Classes a method never trained on are scored by the trained head itself."""
    return head


def cross_entropy(head, image_feats, text_feats, labels, loss_config):
    """Cross-entropy of each image's class logits: CoOp eq. 2, CLIP-Adapter sec. 3.2, CLAP."""
    from vacsr.model.clip_heads import cross_entropy_loss

    return cross_entropy_loss(head, image_feats, text_feats, labels, loss_config)


@dataclass(frozen=True)
class Method:
    """One method. `build_head(adapter_config, backbone)` makes its head, a module scoring
    (image features, text features) blocks (`forward` -> AdapterOutput, `score_block` ->
    (logits, sigma_hat or None)); `loss(head, image_feats, text_feats, labels, loss_config)` ->
    (loss, named parts), None for a method that does not train."""

    name: str
    cites: str  # the paper (and section) the module implements
    trains: str  # what trains, in words (a report's budget section)
    build_head: Callable[[Any, Any], Any]
    loss: LossFn | None
    # searched keys of its own, and the sweep kind's searched keys it keeps (None: all of them)
    space: Mapping[str, Domain] = field(default_factory=dict)
    kind_keys: tuple[str, ...] | None = None
    protocol: Mapping[str, Any] = field(default_factory=dict)  # config values it fixes
    # keys of its protocol a sweep's --set leaves to it (a value it does not use: a method that
    # trains nothing has one epoch, its evaluation, whatever --epochs says for the others)
    ignores: tuple[str, ...] = ()
    own_keys: tuple[str, ...] = ()  # config keys only this method reads
    tasks: tuple[str, ...] = ("classification", "retrieval")
    # how a class set other than its training set (novel classes, another dataset) is scored:
    # (the trained head, the evaluated data: its classnames) -> a head for that set, and the rule
    # in words
    unseen_head: Callable[[Any, Any], Any] = keep
    unseen_rule: str = "the trained head, as on the trained classes"
    # the class prompts: (classification data, the head) -> strings; None: the dataset's own
    # template (`data.prompts()`)
    prompts: Callable[[Any, Any], list[str]] | None = None
    # the image tower is frozen whole: a run may train on image features computed once
    frozen_image_tower: bool = False
    # what its head needs from a run, asked here rather than probed on the head: a weight per
    # training class, sized to the training split's class names before the first step
    # (`head.fit_classes(classnames)`, the linear probe); the class prompts encoded by the head
    # itself through the frozen text tower, every step, since what it learns sits inside them
    # (`head.encode_prompts(backbone, tokens)`, CoOp's context)
    class_weights: bool = False
    encodes_prompts: bool = False
    # the class prompts depend on each image (CoCoOp's meta-net): a batch's class features are
    # (B, C, d), one set per image (`head.encode_conditioned(backbone, tokens, image_feats)`),
    # and an evaluation pass gives each image's class logits where the text tower is
    conditions_prompts: bool = False
    # a deep method's head acts inside the towers (vacsr/model/tower_hooks.py: its
    # `tower_hooks()` are attached to the backbone): from a run's flat config values and a
    # tower's depth, how many of its blocks lie from its lowest hook to the top (a setting the
    # tower cannot hold is one ConfigError line); the frozen prefix, the cache and the cost
    # and memory estimates end below them. None: it hooks no block
    hooked_blocks: Callable[[Mapping[str, Any], int], int] | None = None
    # its prompts put a learned context before the class name (CoOp's: adapter.context_tokens
    # vectors, or an init phrase's tokens): a sweep checks every value its trials can draw
    # against the model's text positions (vacsr/model/prompt_room.py)
    learned_context: bool = False

    @property
    def trained(self) -> bool:
        return self.loss is not None

    def check_task(self, task: str) -> None:
        """One line when `task` (a config's data.task) is not one this method scores."""
        if task not in self.tasks:
            raise ConfigError(f"adapter.kind: {self.name} supports data.task "
                              f"{' or '.join(self.tasks)}, not {task!r}")

    def check_config(self, values: Mapping[str, Any]) -> None:
        """One line when a config's flat `values` contradict what this method fixes (a frozen
        CLIP for the compared methods): the method would silently be another one."""
        wrong = {key: value for key, value in self.protocol.items() if values.get(key) != value}
        if wrong:
            fixes = " ".join(f"{key}={shown(value)}" for key, value in wrong.items())
            has = ", ".join(f"{key}={shown(values.get(key))}" for key in wrong)
            raise ConfigError(f"adapter.kind: {self.name} runs with {fixes} ({self.trains}); "
                              f"this config has {has}; set those values")

    def fill_fixed(self, config, given: Collection[str]) -> dict[str, Any]:
        """Set on `config` the values this method fixes that the user gave none of (`given`: the
        keys a config file or an override set), as a sweep gives them to its units; returns
        them, {key: value}. A value given against them stays, for `check_config` to refuse: the
        run would silently be another method."""
        filled = {key: value for key, value in self.protocol.items() if key not in given}
        for key, value in filled.items():
            set_value(config, key, value)
        return filled

    def searched(self, kind_space: Mapping[str, Domain]) -> dict[str, Domain]:
        """What this method's trials search in a kind whose space is `kind_space`: the kind's keys
        it keeps, then its own."""
        kept = {key: domain for key, domain in kind_space.items()
                if self.kind_keys is None or key in self.kind_keys}
        return {**kept, **self.space} if self.trained else {}


def share_of_depth(setting: int, depth: int, share: tuple[int, int], key: str,
                   model: str = "the model") -> int:
    """A deep method's block count in a `depth`-block tower: `setting` (the config's `key`), or
    with -1 its paper's share of the depth (`share`: blocks per that many, at least one). More
    than the tower has is one line, not fewer blocks than asked for."""
    if setting == -1:
        return max(1, round(depth * share[0] / share[1]))
    if setting > depth:
        raise ConfigError(f"{key}: {setting} exceeds the {depth} blocks of {model}'s towers; "
                          f"expected at most {depth}, or -1 (the paper's share)")
    return setting


def class_prompts(model, data) -> list[str]:
    """The prompts a model's class features come from (one per class of `data`): its method's,
    else the dataset's template."""
    prompts = model.method.prompts
    return data.prompts() if prompts is None else prompts(data, model.head)
