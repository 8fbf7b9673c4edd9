"""loss.backbone_grad: which VACSR terms reach the backbone (vacsr/model/backbone_grad.py)."""
import pytest
import torch

from conftest import small_adapter
from vacsr.model.backbone_grad import vacsr_loss_recon_to_backbone
from vacsr.model.losses import vacsr_loss


def _case(seed: int = 0):
    torch.manual_seed(seed)
    head = small_adapter(embed_dim=16).train()  # training mode: z is sampled
    g = torch.Generator().manual_seed(seed)
    image = torch.nn.functional.normalize(torch.randn(6, 16, generator=g), dim=-1)
    text = torch.nn.functional.normalize(torch.randn(5, 16, generator=g), dim=-1)
    labels = torch.zeros(6, 5)
    labels[torch.arange(6), torch.arange(6) % 5] = 1.0
    return head, image.requires_grad_(), text.requires_grad_(), labels


def _grads(loss, head, image, text):
    params = list(head.parameters())
    grads = torch.autograd.grad(loss, [*params, image, text])
    return grads[:len(params)], grads[len(params):]


def _seeded(fn, seed: int = 7):
    torch.manual_seed(seed)  # the adapter's sampling noise
    return fn()


def test_recon_reading_keeps_loss_and_adapter_gradient_and_feeds_features_l_recon_only():
    head, image, text, labels = _case()
    full, parts = _seeded(lambda: vacsr_loss(head(image, text), labels))
    split, split_parts = _seeded(lambda: vacsr_loss_recon_to_backbone(head, image, text, labels))
    recon, _ = _seeded(lambda: vacsr_loss(head(image, text), labels, use_kl=False,
                                          use_sigma_loss=False))
    torch.testing.assert_close(split, full)
    torch.testing.assert_close(split_parts["sigma_pos"], parts["sigma_pos"])
    head_full, feats_full = _grads(full, head, image, text)
    head_split, feats_split = _grads(split, head, image, text)
    _, feats_recon = _grads(recon, head, image, text)
    for a, b in zip(head_split, head_full):  # the adapter learns from the whole loss
        torch.testing.assert_close(a, b)
    for a, b in zip(feats_split, feats_recon):  # the features from beta L_recon alone
        torch.testing.assert_close(a, b)
    # and that differs from every term's gradient (L_sigma's reaches the features too)
    assert not torch.allclose(feats_full[0], feats_recon[0], atol=1e-4)


def test_recon_reading_without_feature_gradient_is_the_plain_loss():
    head, image, text, labels = _case(seed=1)
    image, text = image.detach(), text.detach()
    full, _ = _seeded(lambda: vacsr_loss(head(image, text), labels))
    split, _ = _seeded(lambda: vacsr_loss_recon_to_backbone(head, image, text, labels))
    torch.testing.assert_close(split, full)
    with pytest.raises(RuntimeError):  # nothing but the adapter in the graph
        torch.autograd.grad(split, [image])


@pytest.mark.parametrize("task_name, setting, reading", [
    ("retrieval", "all", "all"), ("retrieval", "recon", "recon"),
    ("classification", "recon", "recon"), ("classification", "all", "all")])
def test_task_routes_loss_backbone_grad(task_name, setting, reading):
    from types import SimpleNamespace

    from vacsr.config import load_config
    from vacsr.methods.registry import METHODS
    from vacsr.tasks import ClassificationTask, PairBatch, RetrievalTask

    head, image, text, labels = _case(seed=2)
    keys = labels.argmax(dim=1)  # y_ij = [keys_i == j]
    pairs = PairBatch(image, text, keys, torch.arange(5))
    model, loss_config = (SimpleNamespace(head=head, method=METHODS["vacsr"]),
                          load_config(overrides=[f"loss.backbone_grad={setting}"]).loss)
    task = (RetrievalTask(model, loss_config) if task_name == "retrieval" else
            ClassificationTask(model, loss_config, prompt_tokens=torch.zeros(5, 4)))
    loss, _ = _seeded(lambda: task.loss_from_pairs(pairs))
    expected, _ = _seeded(lambda: vacsr_loss(head(image, text), labels,
                                             **({} if reading == "all" else
                                                {"use_kl": False, "use_sigma_loss": False})))
    torch.testing.assert_close(_grads(loss, head, image, text)[1][0],
                               _grads(expected, head, image, text)[1][0])
