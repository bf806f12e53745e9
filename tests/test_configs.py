"""Every shipped config trains: one step after a step-0 evaluation, on the default engine, with a tiny model.

The model is a tiny random Llama over the real tokenizer, so prompts (system prompt, tool docs, few-shot exchanges)
have their real lengths: the searchqa, sql, countdown, webshop and code heads are longer than the native engine's
initial cache (256 positions), which is what made a step-0 evaluation followed by a training step crash (issue 25).
Each config's own env, context strategy, estimator and engine choice run; only the budget is cut.
"""

from pathlib import Path

import pytest

from turnrl.build import build
from turnrl.config import load_config
from turnrl.engines.native import NativeEngine
from turnrl.models import tiny_model
from turnrl.monitor.sinks import read_metrics
from turnrl.loop import train

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))

SMALL = [
    "train.steps=1", "rollout.tasks_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4",
    "env.max_turns=2", "eval.num_tasks=2", "eval.at_start=true", "log.tensorboard=false", "log.progress=false",
    "log.report=false", "log.checkpoint_at_end=false",
]


def test_every_shipped_config_is_covered():
    assert {p.stem for p in CONFIGS} >= {"default", "searchqa", "code"}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_trains_one_step_after_a_step_0_evaluation(tmp_path, tokenizer, path):
    cfg = load_config(path, SMALL + [f"log.run_dir={tmp_path}", f"log.name={path.stem}"])
    components = build(cfg, model=tiny_model(tokenizer, seed=0), tokenizer=tokenizer)
    assert isinstance(components.engine, NativeEngine)  # rollout.engine=auto picks it for a Llama model
    rows = read_metrics(train(cfg, components=components) / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[0]["eval/num_tasks"] == 2.0 and rows[1]["eval/num_tasks"] == 2.0
    assert rows[1]["rollout/train_groups"] == 2.0
