import pytest

from vacsr.config import Config, flatten, load_config, save_config
from vacsr.errors import ConfigError


def test_defaults_follow_the_paper():
    config = load_config()
    assert (config.loss.alpha_kl, config.loss.beta, config.loss.gamma) == (0.0005, 1.0, 1.0)
    assert config.adapter.num_components == 2 and config.loss.num_hard_negatives == 1
    assert config.optim.lr == 5e-4 and config.optim.decay_epochs == [15]
    assert config.optim.grad_clip == 2.0 and config.train.epochs == 25
    assert config.loss.straight_through and config.adapter.bounded_sigma
    assert config.loss.neg_sigma_target == "label"


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("loss:\n  beta: 2.0\nadapter:\n  num_components: 3\n")
    config = load_config(path, ["loss.beta=0.5", "optim.lr=1e-3", "optim.decay_epochs=[3, 5]"])
    assert config.loss.beta == 0.5  # override wins over the file
    assert config.adapter.num_components == 3
    assert config.optim.lr == pytest.approx(1e-3)  # "1e-3" is a string to PyYAML
    assert config.optim.decay_epochs == [3, 5]


@pytest.mark.parametrize("override, fragment", [
    ("adapter.num_components=0", "adapter.num_components"),
    ("loss.beta=-1", "loss.beta"),
    ("loss.alpha_kl=-0.1", "loss.alpha_kl"),
    ("loss.num_hard_negatives=0", "loss.num_hard_negatives"),
    ("optim.decay_epochs=[]", "optim.decay_epochs"),
    ("loss.neg_sigma_target=maybe", "loss.neg_sigma_target"),
    ("loss.reduction=sum", "loss.reduction"),
    ("loss.neg_columns=some", "loss.neg_columns"),
    ("loss.backbone_grad=sigma", "loss.backbone_grad"),
    ("loss.beta=.inf", "loss.beta"),
    ("loss.gamma=.nan", "loss.gamma"),
    ("adapter.logvar_bound=0", "adapter.logvar_bound"),
    ("adapter.logvar_bound=.inf", "adapter.logvar_bound"),
    ("adapter.init_logit_bias=-.inf", "adapter.init_logit_bias"),
    ("model.trainable_image_blocks=-2", "model.trainable_image_blocks"),
    ("train.epochs=zero", "train.epochs"),
    ("loss.use_kl=1", "loss.use_kl"),
    ("loss.nope=1", "unknown key"),
    ("nosection.x=1", "unknown section"),
    ("beta=1", "section.field"),
])
def test_invalid_values_raise_one_clear_error(override, fragment):
    with pytest.raises(ConfigError, match=fragment.replace(".", r"\.")):
        load_config(overrides=[override])


def test_unknown_yaml_key_names_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("loss:\n  betta: 2.0\n")
    with pytest.raises(ConfigError, match="betta"):
        load_config(path)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")


def test_saved_config_loads_back_unchanged(tmp_path):
    config = load_config(overrides=["loss.gamma=0.3", "adapter.kind=sigmoid_baseline",
                                    "model.pretrained=/x/y.pt"])
    save_config(config, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == config
    assert flatten(config)["loss.gamma"] == 0.3
    assert set(flatten(Config())) == set(flatten(config))


def test_a_saved_config_masks_the_keys_of_an_s3_storage_path(tmp_path):
    """train.storage_path (a sweep's --ray-storage) goes into config.yaml and the MLflow params
    (both written from public_dict): its secret key is `***` there, kept in memory."""
    from vacsr.config.serialise import public_dict

    uri = "s3://AKIA1:wJalrXUtn@bucket/x?region=eu"
    config = load_config(overrides=[f"train.storage_path={uri}"])
    save_config(config, tmp_path / "c.yaml")
    assert "wJalrXUtn" not in (tmp_path / "c.yaml").read_text()
    assert public_dict(config)["train"]["storage_path"] == "s3://AKIA1:***@bucket/x?region=eu"
    assert config.train.storage_path == uri
