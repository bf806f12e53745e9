"""Supervised fine-tuning (turnrl.sft, Learner.sft_update) and demonstration-guided RL (algo.demo_coef)."""

import copy
import dataclasses
import json

import pytest
import torch

from tests.test_ddp import _stepped_grads
from turnrl.build import build, demo_samples
from turnrl.cli import main
from turnrl.config import ConfigError, load_config
from turnrl.learner import Learner, LearnerParams
from turnrl.sft import oracle_demos, sft

TINY = ["model.autocast_bf16=false", "rollout.engine=hf", "rollout.tasks_per_step=2", "rollout.group_size=2",
        "eval.num_tasks=2", "log.progress=false", "log.tensorboard=false", "log.report=false"]


@pytest.fixture
def demos(tokenizer, tiny_model):
    c = build(load_config(None, TINY), model=tiny_model, tokenizer=tokenizer)
    return demo_samples(oracle_demos(c, 4))


def learner(model, tokenizer, **changes):
    params = LearnerParams.from_config(load_config(None, [*TINY, "train.grad_clip=1e9"]))
    return Learner(model, dataclasses.replace(params, **changes), tokenizer.pad_token_id)


def test_sft_lowers_the_nll_of_the_demonstrations(tokenizer, tiny_model, demos):
    sgd = learner(tiny_model, tokenizer, lr=1e-2)
    nll = [sgd.sft_update(demos)["train/demo_nll"] for _ in range(8)]
    assert all(b < a for a, b in zip(nll, nll[1:])) and nll[-1] < 0.5 * nll[0], nll


def test_the_demo_loss_is_zero_at_coef_zero_and_its_gradient_is_the_token_mean_nll(tokenizer, demos):
    from turnrl.models import tiny_model

    # coef 0: the update with demonstrations is the update without them
    a, b = tiny_model(tokenizer, seed=1), tiny_model(tokenizer, seed=1)
    policy = demos[:2]
    learner(a, tokenizer, demo_coef=0.0).update(policy, demos=demos)
    learner(b, tokenizer, demo_coef=0.0).update(policy)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))

    # coef c, split over several micro-batches: the gradient of c * (1 / N) sum_t -log pi(y_t), computed by hand
    model, c = tiny_model(tokenizer, seed=2), 0.3
    hand = copy.deepcopy(model)
    demo_learner = learner(model, tokenizer, demo_coef=c, lr=0.0, micro_batch_tokens=64)
    stepped = _stepped_grads(demo_learner)
    metrics = demo_learner.update([], demos=demos)
    n = sum(sum(s.loss_mask) for s in demos)
    total = 0.0
    for s in demos:
        logp = torch.log_softmax(hand(torch.tensor([s.input_ids])).logits[0, :-1].float(), -1)
        picked = logp.gather(-1, torch.tensor(s.input_ids[1:])[:, None])[:, 0]
        total = total - (picked * torch.tensor(s.loss_mask[1:], dtype=torch.float)).sum()
    (c * total / n).backward()
    assert metrics["train/demo_nll"] == pytest.approx(float(total.detach()) / n, rel=1e-4)
    for (name, _), grad, q in zip(model.named_parameters(), stepped[-1], hand.parameters(), strict=True):
        assert torch.allclose(grad, q.grad, atol=1e-6, rtol=1e-3), name


def test_sft_checkpoint_is_where_rl_starts_and_demo_guided_rl_logs_its_nll(tokenizer, tiny_model, tmp_path):
    cfg = load_config(None, [*TINY, "sft.steps=3", "sft.num_demos=3", "sft.lr=1e-3", "eval.every=0",
                             f"log.run_dir={tmp_path}", "log.name=sft"])
    run = sft(cfg, components=build(cfg, model=tiny_model, tokenizer=tokenizer))
    assert run.num_demos == 3 and run.before["eval/num_tasks"] == 2 and run.after["eval/num_tasks"] == 2
    assert run.steps == 3 and run.next_seed == max(d.seed for d in _read(run.run_dir / "demos.jsonl")) + 1
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and "train/demo_nll" in rows[1]

    # model.path = the SFT checkpoint: RL starts from its weights, with the demo term on the demonstrations it wrote
    rl = load_config(None, [*TINY, "train.steps=1", f"model.path={run.model_path}", "algo.demo_coef=0.5",
                            f"algo.demo_file={run.run_dir / 'demos.jsonl'}", "algo.demo_batch=2"])
    c = build(rl)
    assert all(torch.equal(p, q) for p, q in zip(c.model.parameters(), tiny_model.parameters()))
    assert len(c.demos) == sum(len(d.turns) for d in _read(run.run_dir / "demos.jsonl"))
    from turnrl.loop import train

    out = train(rl, components=c, run_dir=tmp_path / "rl")
    step = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"train/demo_nll"' in line]
    assert step and step[0]["train/demo_nll"] > 0


def test_sft_max_minutes_ends_the_run_after_the_step_it_passes_in_with_an_evaluation_and_a_checkpoint(
        tokenizer, tiny_model, tmp_path):
    cfg = load_config(None, [*TINY, "sft.steps=5", "sft.num_demos=2", "sft.max_minutes=1e-6", "eval.every=0",
                             "eval.at_start=false", f"log.run_dir={tmp_path}", "log.name=sft"])
    run = sft(cfg, components=build(cfg, model=tiny_model, tokenizer=tokenizer))
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert run.steps == 1 and [r["step"] for r in rows] == [1] and rows[0]["eval/num_tasks"] == 2
    assert run.after["eval/num_tasks"] == 2 and run.model_path == run.run_dir / "checkpoints" / "step_000001" / "model"
    assert run.model_path.exists()


def _read(path):
    from turnrl.agent.demos import read_demos

    return read_demos(path)


def test_turnrl_sft_end_to_end_on_a_tiny_model(tiny_model_dir, tmp_path, capsys):
    args = ["sft", f"model.path={tiny_model_dir}", *TINY, "env.id=sokoban-v0", "env.max_turns=20", "sft.steps=2",
            "sft.num_demos=2", f"log.run_dir={tmp_path / 'runs'}", "log.name=s"]
    assert main(args) == 0
    out = capsys.readouterr().out
    ckpt = tmp_path / "runs" / "s" / "checkpoints" / "step_000002" / "model"
    demos = [json.loads(line) for line in (tmp_path / "runs" / "s" / "demos.jsonl").read_text().splitlines()]
    assert len(demos) == 2 and f"checkpoint: {ckpt}" in out
    # RL starts past the demonstrated tasks: SFT has memorised them, so group-relative advantages there are zero
    assert f"next: turnrl train model.path={ckpt} train.seed_start={max(d['seed'] for d in demos) + 1}" in out
    with pytest.raises(SystemExit):
        main(["sft", "--help"])
    assert "turnrl sft -c configs/sokoban_sft.yaml" in capsys.readouterr().out


def test_sft_on_lora_adapters_checkpoints_the_adapter_that_rl_loads(tiny_model_dir, tmp_path):
    from turnrl.models.lora import is_lora

    cfg = load_config(None, [*TINY, f"model.path={tiny_model_dir}", "lora.enabled=true", "sft.steps=2", "sft.num_demos=2",
                             "sft.lr=1e-2", "eval.at_start=false", f"log.run_dir={tmp_path}", "log.name=lora"])
    c = build(cfg)
    run = sft(cfg, components=c)
    assert (run.model_path / "adapter_config.json").exists() and not (run.model_path / "model.safetensors").exists()
    rl = build(load_config(None, [*TINY, f"model.path={run.model_path}"]))
    assert is_lora(rl.model)
    trained = {n: p for n, p in c.model.named_parameters() if "lora_" in n}
    assert trained and all(torch.equal(p, trained[n]) for n, p in rl.model.named_parameters() if "lora_" in n)
    assert any(p.abs().sum() > 0 for n, p in trained.items() if "lora_B" in n)  # SFT moved the adapter


@pytest.mark.probe("bad_input")
def test_bad_demo_settings_fail_with_the_fix(tokenizer, tiny_model, capsys):
    with pytest.raises(ConfigError, match="algo.demo_file=FILE.jsonl"):
        load_config(None, ["algo.demo_coef=0.1"])
    assert main(["sft", *TINY, "sft.demos=file"]) == 2
    assert "sft.demos=file needs sft.demo_file" in capsys.readouterr().err
