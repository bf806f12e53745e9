from pathlib import Path

import pytest
import yaml

from turnrl import config
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
        ("eval.seed_start=3", "set eval.seed_start=160 (or more)"),
        ("train.lr", "not key=value"),
        ("algo.estimator=grop", "Did you mean 'grpo'"),
    ],
)
@pytest.mark.probe("bad_input")
def test_bad_overrides_name_the_key_and_the_fix(override, needle):
    with pytest.raises(ConfigError, match=None) as e:
        load_config(None, [override])
    assert needle in str(e.value)


@pytest.mark.probe("bad_input")
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


# --------------------------------------------------------------------------- bad values (issue 17.3)


@pytest.mark.parametrize(
    "override, key",
    [
        ("train.lr=.inf", "train.lr"),
        ("rollout.temperature=.inf", "rollout.temperature"),
        ("algo.gamma=.nan", "algo.gamma"),
        ("algo.prm_weight=-.inf", "algo.prm_weight"),
        ("train.betas=[.nan, 0.9]", "train.betas"),
        ("algo.dual_clip=.inf", "algo.dual_clip"),
        ("train.max_minutes=.inf", "train.max_minutes"),
    ],
)
@pytest.mark.probe("bad_input")
def test_non_finite_floats_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert f"'{key}" in str(e.value) and "finite" in str(e.value)


@pytest.mark.parametrize(
    "override, key",
    [("train.seed=-1", "train.seed"), ("train.seed=4294967296", "train.seed"), ("train.betas=[1.5, 0.9]", "train.betas"),
     ("train.betas=[0.9, -0.1]", "train.betas")],
)
@pytest.mark.probe("bad_input")
def test_values_the_run_would_crash_on_are_refused(override, key):
    with pytest.raises(ConfigError, match=key):
        load_config(None, [override])


@pytest.mark.probe("bad_input")
def test_zero_steps_is_refused_with_the_command_that_evaluates():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.steps=0"])
    assert "train.steps=0" in str(e.value) and str(e.value).rstrip().endswith("`turnrl eval --checkpoint RUN`")


def test_every_key_has_a_description():
    from turnrl.config import Config

    missing = [f"{s}.{n}" for s, sec in Config.model_fields.items() for n, f in sec.annotation.model_fields.items()
               if not (f.description or "").strip()]
    assert missing == []


# --------------------------------------------------------------------------- bad files (issue 17.3)


@pytest.mark.probe("bad_input")
def test_unreadable_config_files_are_one_line_errors(tmp_path):
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    for path, needle in [(binary, "not a text file"), (tmp_path, "cannot be read (is a directory)")]:
        with pytest.raises(ConfigError) as e:
            load_config(path)
        assert needle in str(e.value) and "\n" not in str(e.value)
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  steps: [1, 2\n  lr: 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(bad)
    assert "not valid YAML" in str(e.value) and "line" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.probe("bad_input")
def test_bad_prm_fails_at_load_time(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "prm_ok_mod.py").write_text("def score(trajectory, turn):\n    return 0.0\nnot_callable = 3\n")
    assert load_config(None, ["algo.prm=prm_ok_mod:score"]).algo.prm == "prm_ok_mod:score"
    for spec, needle in [("no_such_prm_module:score", "No module named 'no_such_prm_module'"),
                         ("prm_ok_mod:missing", "no callable 'missing'"),
                         ("prm_ok_mod:not_callable", "no callable 'not_callable'"),
                         ("prm_ok_mod", "must look like 'package.module:function'")]:
        with pytest.raises(ConfigError) as e:
            load_config(None, [f"algo.prm={spec}"])
        assert "algo.prm" in str(e.value) and needle in str(e.value)


# --------------------------------------------------------------------------- held-out seeds (issue 16.1)


@pytest.mark.parametrize(
    "overrides, overlap",
    [
        (["train.seed_start=100", "eval.seed_start=50"], True),          # eval range runs into the training range
        (["train.seed_start=0", "eval.seed_start=100"], True),           # eval starts inside training
        (["train.seed_start=100", "eval.seed_start=37", "eval.num_tasks=64"], True),   # eval's last seed is 100
        (["train.seed_start=100", "eval.seed_start=36", "eval.num_tasks=64"], False),  # [36, 100) ends where training starts
        (["train.seed_start=200", "eval.seed_start=0", "eval.num_tasks=64"], False),
        (["train.seed_start=0", "train.steps=10", "eval.seed_start=40"], False),     # 10 steps x 4 tasks = [0, 40)
        (["train.seed_start=0", "train.steps=10", "eval.seed_start=40", "algo.dynamic_sampling_rounds=2"], True),
    ],
)
@pytest.mark.probe("bad_input")
def test_training_and_eval_seeds_never_overlap(overrides, overlap):
    if not overlap:
        load_config(None, overrides)
        return
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert "overlap" in str(e.value) and "eval.seed_start" in str(e.value)


# --------------------------------------------------------------------------- help (issue 25.7)


def test_help_for_one_key_or_one_section():
    text = config_help(key="train.lr")
    assert "train.lr = 2e-05" in text and "AdamW" in text and "train.steps" not in text
    section = config_help(key="eval")
    assert "eval.num_tasks" in section and "eval.seed_start" in section and "train.lr" not in section
    with pytest.raises(ConfigError, match="Did you mean 'train.lr'"):
        config_help(key="train.lrr")


def test_help_shows_the_resolved_values(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  lr: 3.0e-6\n")
    text = config_help(load_config(p, ["rollout.group_size=4"]))
    assert "train.lr = 3e-06  (default 2e-05)" in text and "rollout.group_size = 4  (default 8)" in text
    assert "train.steps = 40\n" in text


# --------------------------------------------------------------------------- familiar names (issue 23.1)


@pytest.mark.parametrize(
    "override, suggestion",
    [
        ("learning_rate=1e-5", "train.lr"),
        ("train.learning_rate=1e-5", "train.lr"),
        ("num_generations=4", "rollout.group_size"),
        ("max_completion_length=64", "rollout.max_new_tokens"),
        ("beta=0.04", "algo.kl_coef"),
        ("num_iterations=2", "algo.ppo_epochs"),
        ("epsilon=0.2", "algo.clip_low"),
        ("cliprange=0.2", "algo.clip_low"),
        ("epsilon_high=0.28", "algo.clip_high"),
        ("max_grad_norm=1.0", "train.grad_clip"),
        ("loss_type=dr_grpo", "algo.loss_agg"),
        ("per_device_train_batch_size=8", "rollout.tasks_per_step"),
        ("gradient_accumulation_steps=4", "train.micro_batch_tokens"),
        ("actor_rollout_ref.actor.optim.lr=1e-6", "train.lr"),
        ("actor_rollout_ref.rollout.n=5", "rollout.group_size"),
        ("data.train_batch_size=256", "rollout.tasks_per_step"),
        ("algorithm.adv_estimator=grpo", "algo.estimator"),
        ("actor_rollout_ref.actor.kl_loss_type=low_var_kl", "algo.kl_type"),
        ("critic.optim.lr=1e-5", "algo.critic_lr"),
        ("actor_rollout_ref.actor.optim.betas=[0.9,0.99]", "train.betas"),  # not in the table: its last part is ours
    ],
)
def test_familiar_names_suggest_turnrl_keys(override, suggestion):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert f"unknown config key '{override.split('=')[0]}'" in str(e.value)  # never accepted
    assert f"Did you mean '{suggestion}'" in str(e.value)


def test_familiar_names_in_a_yaml_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  learning_rate: 1.0e-5\n")
    with pytest.raises(ConfigError, match="Did you mean 'train.lr'"):
        load_config(p)


@pytest.mark.parametrize("override, value", [("algo.kl_type=low_var_kl", "k3"), ("algo.estimator=gae", "ppo_token"),
                                            ("algo.loss_agg=dr_grpo", "seq-mean-token-sum-norm")])
def test_familiar_values_suggest_turnrl_values(override, value):
    with pytest.raises(ConfigError, match=f"Did you mean '{value}'"):
        load_config(None, [override])


def test_coming_from_doc_lists_every_alias():
    from turnrl.config import ALIASES, valid_keys

    doc = (ROOT / "docs" / "coming_from.md").read_text()
    for name, alias in ALIASES.items():
        assert f"`{name}`" in doc, name
        assert all(k in valid_keys() for k in alias.keys), name
    assert "docs/coming_from.md" in (ROOT / "README.md").read_text()


# --------------------------------------------------------------------------- resume (issue 25.3)


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    config.write_config(load_config(None, ["train.steps=4", "log.name=run", "rollout.group_size=4"]), run / "config.yaml")
    return run


def test_resume_applies_allowed_changes_and_lists_them(run_dir):
    cfg, changes = config.resume_config(run_dir, ["train.steps=8", "train.lr=1e-5", "eval.every=2", "rollout.group_size=4"])
    assert cfg.train.steps == 8 and cfg.train.lr == 1e-5 and cfg.eval.every == 2
    assert [(c.key, c.old, c.new) for c in changes] == [("train.steps", 4, 8), ("train.lr", 2e-5, 1e-5), ("eval.every", 5, 2)]


@pytest.mark.parametrize(
    "override",
    ["rollout.group_size=8", "algo.estimator=rloo", "model.path=/elsewhere", "train.betas=[0.9, 0.999]",
     "train.warmup_steps=3", "log.name=other", "env.id=sokoban-v0", "algo.clip_high=0.3"],
)
@pytest.mark.probe("bad_input")
def test_resume_refuses_changes_to_what_the_checkpoint_means(run_dir, override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError) as e:
        config.resume_config(run_dir, [override])
    msg = str(e.value)
    assert key in msg and "cannot change on resume" in msg
    assert f"turnrl train -c {run_dir}/config.yaml" in msg and override in msg  # the fix: a new run with that value
    assert ("log.name=run-2" in msg) == (key != "log.name")  # ... beside the run, not in it


def test_resume_with_a_file_applies_it_under_the_same_rules(run_dir, tmp_path):
    more = tmp_path / "more.yaml"
    more.write_text("train:\n  steps: 6\nrollout:\n  group_size: 4\n")  # group_size unchanged: not a change
    cfg, changes = config.resume_config(run_dir, ["train.max_minutes=5"], path=more)
    assert [(c.key, c.new) for c in changes] == [("train.steps", 6), ("train.max_minutes", 5.0)]
    more.write_text("algo:\n  estimator: rloo\n")
    with pytest.raises(ConfigError, match="algo.estimator"):
        config.resume_config(run_dir, [], path=more)


def test_recorded_changes_rewrite_the_run_config(run_dir):
    import json

    cfg, changes = config.resume_config(run_dir, ["train.steps=8", "train.lr=1e-5"])
    config.record_changes(run_dir, cfg, changes, step=4)
    assert load_config(run_dir / "config.yaml") == cfg
    rows = [json.loads(line) for line in (run_dir / "config_changes.jsonl").read_text().splitlines()]
    assert rows == [{"step": 4, "key": "train.steps", "old": 4, "new": 8}, {"step": 4, "key": "train.lr", "old": 2e-5, "new": 1e-5}]
    before = (run_dir / "config.yaml").read_text()
    config.record_changes(run_dir, cfg, [], step=4)  # nothing changed: nothing written
    assert (run_dir / "config.yaml").read_text() == before and len((run_dir / "config_changes.jsonl").read_text().splitlines()) == 2
