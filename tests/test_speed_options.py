"""The learner's cheaper-update options: frozen lower layers, the no-grad prompt, the fused value head.

Each one's claim is checked against the exact update: frozen layers leave the rest's gradient exact, the no-grad
prompt leaves the logits exact (and only the gradient approximate), the fused value head gives the same gradient as
the critic's own pass.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.test_critic import _batch, _cfg
from tests.test_learner import _samples
from turnrl import credit
from turnrl.config import load_config
from turnrl.credit import CreditParams
from turnrl.learner import Critic, CriticParams, Learner, LearnerParams, ValueBatch, build_samples
from turnrl.learner.learner import packed_logprobs, response_logits
from turnrl.learner.samples import collate
from turnrl.models.freeze import FreezeError, decoder_layers, freeze_lower_layers


def _params(**train) -> LearnerParams:
    cfg = load_config(overrides=["model.autocast_bf16=false", "algo.estimator=grpo"] + [f"train.{k}={v}" for k, v in train.items()])
    return LearnerParams.from_config(cfg)


def _grads(model, samples, params: LearnerParams) -> dict[str, torch.Tensor]:
    """The summed gradient of one update's loss (the step itself is skipped: lr is irrelevant, weights unchanged)."""
    learner = Learner(model, params, pad_id=0)
    learner._step = lambda stats: 0.0
    learner.update(samples)
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _cosine(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    x = torch.cat([a[k].flatten() for k in sorted(a)])
    y = torch.cat([b[k].flatten() for k in sorted(a)])
    return float(x @ y / (x.norm() * y.norm()))


def test_no_grad_prompt_keeps_the_logits_and_only_approximates_the_gradient(tiny_model):
    samples = _samples(n=6, prefix_len=24)
    batch = collate(samples, pad_id=0, min_shared_prefix=4)
    assert batch.ids.shape[1] > batch.keep  # there are context columns before the kept span to run without autograd
    exact = packed_logprobs(response_logits(tiny_model, batch), batch, 1.0)
    cheap = packed_logprobs(response_logits(tiny_model, batch, prompt_grad=False), batch, 1.0)
    assert torch.allclose(exact, cheap, atol=1e-5)
    full = _grads(copy.deepcopy(tiny_model), samples, _params())
    approx = _grads(copy.deepcopy(tiny_model), samples, _params(prompt_grad="false"))
    assert _cosine(full, approx) < 0.9999  # the path through the context's keys and values is really cut
    assert _cosine(full, approx) > 0.3  # but the direction is close to the exact gradient's
    head = "lm_head.weight" if "lm_head.weight" in full else "model.embed_tokens.weight"
    assert full[head].norm() > 0 and approx[head].norm() > 0


def test_frozen_layers_get_no_gradient_and_the_rest_get_the_exact_one(tiny_model):
    samples = _samples(n=4, prefix_len=20)
    full = _grads(copy.deepcopy(tiny_model), samples, _params())
    model = copy.deepcopy(tiny_model)
    k = len(decoder_layers(model)) - 1
    assert freeze_lower_layers(model, k) > 0
    frozen = _grads(model, samples, _params())
    assert not any(n.startswith(f"model.layers.{i}.") for n in frozen for i in range(k))  # no gradient below layer k
    top = [n for n in full if n.startswith(f"model.layers.{k}.") or n == "model.norm.weight"]
    assert top and all(n in frozen for n in top)
    for n in top:
        assert torch.allclose(frozen[n], full[n], atol=1e-6, rtol=1e-4), n
    learner = Learner(model, _params(), pad_id=0)
    trained = {id(p) for g in learner.optimizer.param_groups for p in g["params"]}
    assert not any(id(p) in trained for p in decoder_layers(model)[0].parameters())  # no optimizer state either


def test_frozen_layers_run_no_backward_when_the_batch_prefix_is_run_once(tiny_model):
    """The batch's shared prefix (train.prefix_once) must not carry autograd into the frozen layers: their keys and
    values are constants, and the rest's gradient is the one without the shared prefix."""
    samples = _samples(n=6, prefix_len=24)
    k = len(decoder_layers(tiny_model)) - 1
    grads, with_autograd = {}, {}
    for once in ("true", "false"):
        model = copy.deepcopy(tiny_model)
        freeze_lower_layers(model, k)
        seen = with_autograd[once] = set()
        for i, layer in enumerate(decoder_layers(model)):
            layer.self_attn.register_forward_hook(
                lambda mod, args, out, i=i: seen.add(i) if out[0].requires_grad else None)
        grads[once] = _grads(model, samples, _params(micro_batch_tokens=64, prefix_once=once))
    assert with_autograd["true"] == with_autograd["false"] == {k}
    assert set(grads["true"]) == set(grads["false"])
    for n, g in grads["false"].items():
        assert torch.allclose(grads["true"][n], g, atol=1e-6, rtol=1e-4), n


def test_freeze_layers_beyond_the_model_is_refused_with_the_fix(tiny_model):
    n = len(decoder_layers(tiny_model))
    with pytest.raises(FreezeError, match=f"at most {n}"):
        freeze_lower_layers(copy.deepcopy(tiny_model), n + 1)


def test_fused_value_head_gives_the_gradient_and_metrics_of_the_critics_own_pass(tiny_model, tokenizer):
    groups = _batch()[1:]  # a truncated, a terminated and a full-context trajectory
    trajs = [t for g in groups for t in g.trajectories]
    results = []
    for fused in (False, True):
        cfg = _cfg(fused_value=str(fused).lower(), value_clip=0.5)
        model = copy.deepcopy(tiny_model)
        torch.manual_seed(0)
        critic = Critic(model, CriticParams.from_config(cfg), tokenizer.pad_token_id)
        torch.nn.init.normal_(critic.head.weight, std=0.1)  # a non-zero head: the trunk gets value gradient too
        learner = Learner(model, LearnerParams.from_config(cfg), pad_id=tokenizer.pad_token_id, critic=critic)
        learner._step = lambda stats: 0.0
        est = credit.get_estimator(cfg.algo.estimator)
        params = CreditParams(gamma=cfg.algo.gamma, lam=cfg.algo.lam, values=critic.predict(trajs))
        returns, mask = est.value_targets(groups, params)
        metrics = learner.update(build_samples(trajs, est(groups, params)), ValueBatch(trajs, returns, mask, params.values.token_values))
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        grads["value_head"] = critic.head.weight.grad.clone()
        results.append((metrics, grads))
    (m0, g0), (m1, g1) = results
    assert g0.keys() == g1.keys()
    for n in g0:
        assert torch.allclose(g0[n], g1[n], atol=1e-6, rtol=1e-4), n
    for k in ("value_loss", "value_error", "value_mean", "return_mean", "loss"):
        assert m1[f"train/{k}"] == pytest.approx(m0[f"train/{k}"], rel=1e-5, abs=1e-7), k


def test_training_run_with_every_cheap_option_freezes_the_lower_layers_and_checkpoints(tmp_path, tokenizer):
    from tests.test_train import _run
    from turnrl.monitor.sinks import read_metrics

    opts = ["algo.estimator=ppo_turn", "algo.critic=head", "train.freeze_layers=1", "train.prompt_grad=false",
            "eval.every=0", "eval.at_start=false"]
    run_dir, c = _run(tmp_path, tokenizer, opts, "cheap", steps=1)
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert rows[-1]["train/value_loss"] > 0
    assert not any(p.requires_grad for p in decoder_layers(c.model)[0].parameters())
    assert all(p.requires_grad for p in decoder_layers(c.model)[1].parameters())
