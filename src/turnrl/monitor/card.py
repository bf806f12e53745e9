"""The model card of a checkpoint: ``RUN/checkpoints/step_NNNNNN/README.md``, written with every checkpoint.

It reads like the card of any model on the Hugging Face hub: YAML front matter (``base_model``, ``library_name:
turnrl``, ``tags``, ``env``, and a ``model-index`` entry with the held-out success once an evaluation has run) and a
body with the env, the method (estimator, loss, rollout and optimiser settings), the held-out results (the latest
evaluation at or before the checkpoint's step, read from ``metrics.jsonl``: success, its 95% interval over distinct
tasks and their number), how to load it, and the whole config. The env id goes in ``env`` and ``tags`` rather than
``datasets``, which the hub reads as dataset repositories.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from turnrl.config import Config
from turnrl.models.lora import split_adapter_path
from turnrl.monitor.files import read_jsonl

DEFAULT_BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the hub repository of the embedded model.path=default
CARD = "README.md"


def write_model_card(ckpt: Path, cfg: Config) -> Path:
    """Write ``ckpt/README.md`` for the checkpoint ``ckpt`` (``RUN/checkpoints/step_NNNNNN``) of a run with ``cfg``."""
    ckpt = Path(ckpt)
    run_dir, step = ckpt.parents[1], int(ckpt.name.removeprefix("step_"))
    evals = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "eval/success_rate" in r and r["step"] <= step]
    path = ckpt / CARD
    path.write_text(model_card(cfg, run_dir.name, step, evals[-1] if evals else None))
    return path


def model_card(cfg: Config, name: str, step: int, last_eval: dict[str, Any] | None) -> str:
    """The card's text for run ``name`` at ``step``; ``last_eval`` is a ``metrics.jsonl`` row with ``eval/*`` keys."""
    base = base_model(cfg.model.path)
    front: dict[str, Any] = {"base_model": base} if base else {}
    front.update({"library_name": "turnrl", "pipeline_tag": "text-generation",
                  "tags": ["turnrl", "reinforcement-learning", "multi-turn", "agent", cfg.env.id, cfg.algo.estimator]
                  + (["lora"] if cfg.lora.enabled else []),
                  "env": cfg.env.id})
    if last_eval is not None:
        front["model-index"] = [{"name": name, "results": [{
            "task": {"type": "reinforcement-learning", "name": "multi-turn agent"},
            "dataset": {"type": _eval_env(cfg), "name": f"{_eval_env(cfg)} held-out tasks"},
            "metrics": [{"type": "success_rate", "name": "held-out success", "value": last_eval["eval/success_rate"]}],
        }]}]
    sections = [
        f"# {name} (step {step})\n\nA policy trained with turnrl by reinforcement "
        f"learning on the multi-turn environment `{cfg.env.id}` (at most {cfg.env.max_turns} turns an episode), "
        f"starting from {f'`{base}`' if base else f'the local model `{cfg.model.path}`'}.",
        "## Held-out results\n\n" + _results(cfg, last_eval),
        "## Method\n\n" + _method(cfg, step),
        "## Use\n\n" + _usage(cfg),
        "## Config\n\nThe run's resolved config (its `config.yaml`; `turnrl train -c` reads it):\n\n```yaml\n"
        + yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False) + "```",
    ]
    return f"---\n{yaml.safe_dump(front, sort_keys=False)}---\n\n" + "\n\n".join(sections) + "\n"


def base_model(path: str) -> str | None:
    """The hub id of the model ``model.path`` names (an adapter's base for a LoRA adapter directory); None for a
    local directory, which has no hub id."""
    base, _ = split_adapter_path(path)
    if base == "default":
        return DEFAULT_BASE_MODEL
    return None if Path(base).exists() else base


def _eval_env(cfg: Config) -> str:
    return cfg.eval.env_id or cfg.env.id


def _results(cfg: Config, last_eval: dict[str, Any] | None) -> str:
    if last_eval is None:
        return "No evaluation had run by this checkpoint (`turnrl eval --checkpoint` this directory runs one)."
    e = last_eval
    decoding = "greedy" if cfg.eval.greedy else f"sampled at temperature {cfg.rollout.temperature}"
    return (
        "| env | distinct tasks | success | 95% interval | at step | decoding |\n| --- | --- | --- | --- | --- | --- |\n"
        f"| `{_eval_env(cfg)}` | {int(e['eval/distinct_tasks'])} | {e['eval/success_rate']:.3f} | "
        f"{e['eval/success_ci_low']:.3f} to {e['eval/success_ci_high']:.3f} | {e['step']} | {decoding} |\n\n"
        "One episode per held-out task; the tasks are unseen by content (training skips every seed whose task key an "
        "evaluation task has), and the Wilson interval counts each distinct task once."
    )


def _method(cfg: Config, step: int) -> str:
    a, r, t = cfg.algo, cfg.rollout, cfg.train
    lines = [
        f"- advantage estimator: `{a.estimator}` (gamma {a.gamma}, std-normalised: {a.norm_std}); formulas in turnrl's "
        "docs/algorithms.md",
        f"- policy loss: PPO-clip against the behaviour logprobs, ratio clipped to [1 - {a.clip_low}, 1 + {a.clip_high}] "
        f"({a.ratio_level} level), aggregated `{a.loss_agg}`, {a.ppo_epochs} pass(es) a batch, KL coefficient "
        f"{a.kl_coef}, entropy coefficient {a.entropy_coef}",
        f"- rollouts: {r.tasks_per_step} tasks x a group of {r.group_size} a step, `{r.context}` context, at most "
        f"{r.max_new_tokens} new tokens a turn, temperature {r.temperature}",
        f"- optimisation: AdamW, learning rate {t.lr}; {step} of {t.steps} steps trained",
    ]
    if cfg.lora.enabled:
        lines.append(f"- LoRA adapters (rank {cfg.lora.rank}, alpha {cfg.lora.alpha}) on frozen base weights")
    return "\n".join(lines)


def _usage(cfg: Config) -> str:
    if cfg.lora.enabled:
        load = ("from peft import AutoPeftModelForCausalLM\n\n"
                "model = AutoPeftModelForCausalLM.from_pretrained(\"model\")  # the adapter; its config names the base")
    else:
        load = "from transformers import AutoModelForCausalLM\n\nmodel = AutoModelForCausalLM.from_pretrained(\"model\")"
    return (f"The weights and tokenizer are in `model/` (Hugging Face layout); `state.pt` resumes training.\n\n"
            f"```python\n{load}\n```\n\nEvaluate it on held-out tasks: `turnrl eval --checkpoint THIS_DIRECTORY`.")
