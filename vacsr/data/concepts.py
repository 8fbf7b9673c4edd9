"""Controlled false-negative data: items carry latent concept sets, features are noisy views.

Every item has a concept set (a few of `num_concepts` concepts; only `num_sets` distinct sets occur,
so many items share one). Its image and text raw features are the sum of the set's concept
prototypes, plus an instance component the two share (what a caption says about its own image
beyond the concepts: binary labels reward matching it), view noise and a nuisance subspace of
their own. Training labels are binary
(text j describes image i), so every other item with the same concept set in a batch is a false
negative; evaluation counts all items with the same concept set as relevant (the semantic ground
truth that ECCV Caption adds to COCO, paper appendix C.1). Noisy correspondence (Huang et al. 2021,
paper sec. 4.2) permutes the texts of a fraction of the training items among themselves.

Both towers start from one shared random projection (a "pretrained" start: matched pairs are
already closer than random ones, but the nuisance subspaces blur the ranking), so fine-tuning has
something to fix and something to lose, as fine-tuning CLIP has.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ConceptSpec:
    num_concepts: int = 24
    concepts_per_item: int = 2
    num_sets: int = 48
    raw_dim: int = 48
    nuisance_dim: int = 16
    instance_dim: int = 16
    view_noise: float = 0.6
    nuisance_scale: float = 1.0
    instance_scale: float = 1.0
    num_train: int = 2048
    num_test: int = 480


@dataclass
class ConceptSplit:
    images: torch.Tensor  # (N, D) raw image features
    texts: torch.Tensor  # (N, D) raw text features; texts[j] describes images[text_owner[j]]
    text_owner: torch.Tensor  # (N,) long: the image each text is paired with (noisy in training)
    groups: torch.Tensor  # (N,) long: concept-set index of each image (semantic ground truth)
    text_groups: torch.Tensor  # (N,) long: concept-set index each text really describes


@dataclass
class ConceptData:
    train: ConceptSplit
    test: ConceptSplit
    init_projection: torch.Tensor  # (D, D) the shared "pretrained" projection of both towers


def _concept_sets(spec: ConceptSpec, gen: torch.Generator) -> torch.Tensor:
    """(num_sets, num_concepts) multi-hot rows, all distinct."""
    chosen: list[tuple[int, ...]] = []
    while len(chosen) < spec.num_sets:
        members = tuple(sorted(torch.randperm(spec.num_concepts, generator=gen)
                               [:spec.concepts_per_item].tolist()))
        if members not in chosen:
            chosen.append(members)
    sets = torch.zeros(spec.num_sets, spec.num_concepts)
    for row, members in enumerate(chosen):
        sets[row, list(members)] = 1.0
    return sets


def _split(spec, n, sets, prototypes, nuisance, instance, gen) -> ConceptSplit:
    groups = torch.randint(spec.num_sets, (n,), generator=gen)
    content = sets[groups] @ prototypes  # (n, D)
    # what this one item's image and text share beyond its concepts (binary labels reward it)
    own = torch.randn(n, spec.instance_dim, generator=gen)

    def view(tower: int) -> torch.Tensor:
        noise = spec.view_noise * torch.randn(n, spec.raw_dim, generator=gen)
        style = torch.randn(n, spec.nuisance_dim, generator=gen) @ nuisance[tower]
        return (content + spec.instance_scale * own @ instance[tower] + noise
                + spec.nuisance_scale * style)

    owner = torch.arange(n)
    return ConceptSplit(images=view(0), texts=view(1), text_owner=owner, groups=groups,
                        text_groups=groups.clone())


def make_concept_data(spec: ConceptSpec = ConceptSpec(), seed: int = 0) -> ConceptData:
    """Train and test splits drawn from one set of concepts and prototypes (seeded)."""
    gen = torch.Generator().manual_seed(seed)
    sets = _concept_sets(spec, gen)
    scaled = lambda shape, fan: torch.randn(*shape, generator=gen) / fan ** 0.5  # noqa: E731
    prototypes = scaled((spec.num_concepts, spec.raw_dim), spec.concepts_per_item)  # (C, D)
    nuisance = scaled((2, spec.nuisance_dim, spec.raw_dim), spec.nuisance_dim)  # per tower
    instance = scaled((2, spec.instance_dim, spec.raw_dim), spec.instance_dim)  # per tower
    train = _split(spec, spec.num_train, sets, prototypes, nuisance, instance, gen)
    test = _split(spec, spec.num_test, sets, prototypes, nuisance, instance, gen)
    projection = torch.linalg.qr(torch.randn(spec.raw_dim, spec.raw_dim, generator=gen))[0]
    return ConceptData(train=train, test=test, init_projection=projection)


def add_correspondence_noise(split: ConceptSplit, ratio: float, seed: int = 0) -> ConceptSplit:
    """A seeded int(ratio * N) subset of texts has its image indices permuted among themselves
    (noisy correspondence, Huang et al. 2021); the texts' true groups are kept for reference."""
    if ratio <= 0:
        return split
    n = len(split.text_owner)
    gen = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(n, generator=gen)[:int(ratio * n)]
    owner = split.text_owner.clone()
    owner[chosen] = split.text_owner[chosen[torch.randperm(len(chosen), generator=gen)]]
    return ConceptSplit(images=split.images, texts=split.texts, text_owner=owner,
                        groups=split.groups, text_groups=split.text_groups)
