from pathlib import Path

import pytest
import yaml

from turnrl.config import Config, ConfigError, config_help, load_config

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_and_overrides():
    cfg = load_config(None, ["train.lr=1e-4", "rollout.context=full", "env.kwargs.slippery=true"])
    assert cfg.train.lr == 1e-4 and cfg.rollout.context == "full" and cfg.env.kwargs == {"slippery": True}


@pytest.mark.parametrize(
    "override, needle",
    [
        ("train.lrr=1e-4", "Did you mean 'train.lr'"),
        ("lr=1e-4", "Did you mean 'train.lr'"),
        ("rollout.grup_size=4", "Did you mean 'rollout.group_size'"),
        ("rollout.group_size=0", "'rollout.group_size'"),
        ("rollout.context=window", "'rollout.context'"),
        ("train.steps=many", "'train.steps'"),
        ("algo.kl_coef=0.1", "model.reference=true"),
        ("eval.seed_start=3", "overlaps training seeds"),
        ("train.lr", "not key=value"),
        ("algo.estimator=grop", "Did you mean 'grpo'"),
    ],
)
def test_bad_overrides_name_the_key_and_the_fix(override, needle):
    with pytest.raises(ConfigError, match=None) as e:
        load_config(None, [override])
    assert needle in str(e.value)


def test_unknown_key_in_yaml_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  stepz: 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "train.stepz" in str(e.value) and "train.steps" in str(e.value)
    p.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_default_yaml_is_the_no_argument_default():
    shipped = load_config(ROOT / "configs" / "default.yaml")
    assert shipped.model_dump() == Config().model_dump()


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_validates(path):
    load_config(path)
    assert isinstance(yaml.safe_load(path.read_text()), dict)


def test_help_lists_every_key():
    text = config_help()
    for key in ("train.lr", "rollout.group_size", "algo.estimator", "eval.seed_start"):
        assert key in text
