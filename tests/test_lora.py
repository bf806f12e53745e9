"""LoRA (turnrl.models.lora): only the adapters train, the engines sample from base + adapter, the KL reference is the
base with the adapters disabled (no copy), checkpoints hold the adapter alone and resume exactly, bad targets fail."""

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.test_engine import _prompts
from tests.test_learner import _samples
from tests.test_native_engine import _recomputed_logprobs
from tests.test_resume import COMMON, _train, _without_perf
from tests.test_train import TINY
from turnrl.cli import main
from turnrl.config import ConfigError, load_config
from turnrl.config.lora import LLAMA_PROJECTIONS
from turnrl.engines import HFEngine, SamplingParams
from turnrl.engines.native import NativeEngine
from turnrl.learner import Learner, LearnerParams
from turnrl.models import tiny_model
from turnrl.monitor.files import read_jsonl
from turnrl.models.lora import ADAPTER_WEIGHTS, add_lora, adapter_disabled, load_lora, merged_view, save_adapter

LORA = ["lora.enabled=true", "lora.rank=4", "lora.alpha=8"]


def _lora_model(tokenizer, seed=0, rank=4):
    return add_lora(tiny_model(tokenizer, seed=seed), rank=rank, alpha=2.0 * rank, target_modules=LLAMA_PROJECTIONS)


def _perturb_adapters(model, seed=1, scale=0.5):
    """Give every adapter a non-zero B (fresh adapters compute the base model exactly), so base + adapter differs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)


def _split(model):
    """``(base parameters, adapter parameters)`` of a LoRA model, by name, as copies."""
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return ({n: p for n, p in params.items() if "lora_" not in n}, {n: p for n, p in params.items() if "lora_" in n})


def _peft_forward(model):
    """A copy of ``model`` whose adapted layers run peft's own forward instead of turnrl's fused one."""
    import copy

    from peft.tuners.lora import Linear

    ref = copy.deepcopy(model)
    for module in ref.modules():
        if isinstance(module, Linear):
            module.__class__ = Linear
    return ref


def _logits_and_grads(model, ids, bf16):
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(ids).logits
    logits.float().square().mean().backward()
    return logits.detach().float(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_the_fused_adapter_forward_computes_peft_s_sum_and_gradients(tokenizer):
    model = _lora_model(tokenizer)
    _perturb_adapters(model, scale=0.05)
    ref = _peft_forward(model)
    assert type(model.model.layers[0].mlp.up_proj).__name__ == "FusedLoraLinear"
    ids = torch.randint(0, 1000, (2, 17), generator=torch.Generator().manual_seed(0))
    ours, ours_grads = _logits_and_grads(model, ids, bf16=False)
    theirs, their_grads = _logits_and_grads(ref, ids, bf16=False)
    assert torch.allclose(ours, theirs, atol=1e-5)
    assert set(ours_grads) == set(their_grads) and all("lora_" in n for n in ours_grads)
    for name, g in their_grads.items():
        assert torch.allclose(ours_grads[name], g, rtol=1e-4, atol=1e-7), name
    # under bf16 autocast: as close to the fp32 gradient as peft's own bf16 forward is
    exact = their_grads
    for candidate in (model, ref):
        _, grads = _logits_and_grads(candidate, ids, bf16=True)
        err = max(float((grads[n] - exact[n]).norm() / exact[n].norm()) for n in exact)
        assert err < 0.2, (type(candidate), err)


def test_the_frozen_weight_s_bf16_copy_follows_changes_to_the_weight(tokenizer):
    model = _lora_model(tokenizer)
    layer = model.model.layers[0].self_attn.q_proj
    ids = torch.randint(0, 1000, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        before = model(ids).logits.float()
        with torch.no_grad():
            layer.base_layer.weight.mul_(3.0)  # in place, as loading a checkpoint does
        after = model(ids).logits.float()
    assert torch.equal(layer.base_layer._turnrl_bf16[1], layer.base_layer.weight.to(torch.bfloat16))
    assert not torch.allclose(before, after)


def test_an_update_changes_only_the_adapter_weights(tokenizer):
    model = _lora_model(tokenizer)
    cfg = load_config(None, ["model.autocast_bf16=false", "train.lr=1e-2"])
    learner = Learner(model, LearnerParams.from_config(cfg), pad_id=0)
    trained = {id(p) for g in learner.optimizer.param_groups for p in g["params"]}
    assert trained == {id(p) for n, p in model.named_parameters() if "lora_" in n}
    base_before, adapters_before = _split(model)
    for _ in range(2):  # B starts at zero, so A's first gradient is zero: A moves from the second update on
        assert learner.update(_samples())["train/grad_norm"] > 0
    base_after, adapters_after = _split(model)
    assert all(torch.equal(base_before[n], base_after[n]) for n in base_before)
    assert sum(not torch.equal(adapters_before[n], adapters_after[n]) for n in adapters_before) == len(adapters_before)


@pytest.mark.parametrize("kind", ["native", "hf"])
def test_engine_logprobs_agree_with_the_learner_on_base_plus_adapter_fp32(tokenizer, kind):
    """The fp32 engines' behaviour logprobs are the learner's (peft forward, unmerged) on a model whose adapters
    matter; after the adapters change, a weight sync makes them agree again."""
    model = _lora_model(tokenizer)
    _perturb_adapters(model, seed=1)
    prompts = _prompts(tokenizer)
    params = SamplingParams(max_new_tokens=6, temperature=0.7)
    if kind == "native":
        engine = NativeEngine(model, tokenizer, dtype="fp32", max_len=512, seed=3)
    else:
        engine = HFEngine(model, tokenizer, seed=3)

    def worst(outs):
        return max((_recomputed_logprobs(model, p, o.token_ids, 0.7) - torch.tensor(o.logprobs)).abs().max().item()
                   for p, o in zip(prompts, outs))

    outs = engine.generate(prompts, params)
    assert worst(outs) <= 1e-4
    with adapter_disabled(model):
        assert worst(outs) > 1e-2  # the adapters change the distribution: the agreement above is not the base's
    _perturb_adapters(model, seed=2)
    engine.sync_weights()
    assert worst(engine.generate(prompts, params)) <= 1e-4


def test_the_merged_view_reads_each_adapted_layer_as_one_matrix(tokenizer):
    model = _lora_model(tokenizer)
    _perturb_adapters(model)
    q = model.model.layers[0].self_attn.q_proj
    view = merged_view(model).model.layers[0].self_attn.q_proj
    x = torch.randn(3, q.in_features)
    with torch.no_grad():
        assert torch.allclose(x @ view.weight.T, q(x), atol=1e-5)
    assert view.weight is not q.base_layer.weight and view.bias is None
    assert not any("lora_" in n or "base_layer" in n for n, _ in merged_view(model).named_parameters())


def test_the_reference_is_the_base_with_adapters_disabled_and_kl_is_zero_at_init(tmp_path, tokenizer):
    from turnrl.build import build
    from turnrl.learner.learner import response_logits
    from turnrl.learner.samples import collate

    cfg = load_config(None, TINY + LORA + ["model.reference=true", "algo.kl_coef=0.1", f"log.run_dir={tmp_path}"])
    c = build(cfg, model=tiny_model(tokenizer, seed=0), tokenizer=tokenizer)
    assert c.learner.ref_model is c.model  # no second copy
    metrics = c.learner.update(_samples())
    assert metrics["train/kl"] == 0.0  # B starts at zero: the policy is the base exactly

    _perturb_adapters(c.model)
    batch = collate(_samples(), pad_id=0)
    base = tiny_model(tokenizer, seed=0)
    with torch.no_grad():
        assert torch.equal(c.learner._reference_logits(batch), response_logits(base, batch))
        assert not torch.allclose(response_logits(c.model, batch), response_logits(base, batch), atol=1e-3)
    assert all(p.requires_grad for n, p in c.model.named_parameters() if "lora_" in n)  # adapters back on, trainable


def test_a_checkpoint_holds_only_the_adapter_and_resume_is_exact(tmp_path, tokenizer):
    full = _train(tmp_path, tokenizer, "full", COMMON + LORA)
    split = _train(tmp_path, tokenizer, "split", COMMON + LORA)
    for p in (split / "checkpoints" / "step_000004").rglob("*"):
        p.unlink() if p.is_file() else None
    (split / "checkpoints" / "latest").write_text("step_000002")
    _train(tmp_path, tokenizer, "split", COMMON + LORA, resume=True)

    assert _without_perf(read_jsonl(split / "metrics.jsonl")) == _without_perf(read_jsonl(full / "metrics.jsonl"))
    model_dir = full / "checkpoints" / "step_000004" / "model"
    assert not (model_dir / "model.safetensors").exists()
    tensors = load_file(model_dir / ADAPTER_WEIGHTS)
    assert tensors and all(".lora_A." in k or ".lora_B." in k for k in tensors)
    assert json.loads((model_dir / "adapter_config.json").read_text())["r"] == 4
    a = load_file(model_dir / ADAPTER_WEIGHTS)
    b = load_file(split / "checkpoints" / "step_000004" / "model" / ADAPTER_WEIGHTS)
    assert all(torch.equal(a[k], b[k]) for k in a)  # the resumed run ends on the same adapter, bit for bit


def test_an_adapter_directory_loads_into_peft_and_back(tmp_path, tokenizer):
    from peft import PeftModel

    model = _lora_model(tokenizer)
    _perturb_adapters(model)
    save_adapter(model, tmp_path / "adapter")
    ids = torch.tensor([_prompts(tokenizer)[0]])
    with torch.no_grad():
        want = model(ids).logits
        theirs = PeftModel.from_pretrained(tiny_model(tokenizer, seed=0), tmp_path / "adapter")
        assert torch.allclose(theirs(input_ids=ids).logits, want, atol=1e-5)
        ours = load_lora(tiny_model(tokenizer, seed=0), tmp_path / "adapter")
        assert torch.equal(ours(ids).logits, want)


def test_eval_checkpoint_runs_on_a_lora_run(tmp_path, tiny_model_dir, capsys):
    tiny = ["model.autocast_bf16=false", "rollout.tasks_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=2",
            "eval.num_tasks=2", "log.progress=false", "log.tensorboard=false", "log.report=false"]
    assert main(["train", "train.steps=1", f"model.path={tiny_model_dir}", *tiny, *LORA, f"log.run_dir={tmp_path}", "log.name=r"]) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(tmp_path / "r"), "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out.strip().splitlines()[-1])["eval/distinct_tasks"] == 2


def test_a_bad_target_module_names_the_models_linear_layers(tmp_path, tokenizer):
    from turnrl.build import build

    cfg = load_config(None, TINY + LORA + ["lora.target_modules=[q_proj, q_prj]", f"log.run_dir={tmp_path}"])
    with pytest.raises(ConfigError) as e:
        build(cfg, model=tiny_model(tokenizer), tokenizer=tokenizer)
    msg = str(e.value)
    assert "'q_prj' is not a linear layer" in msg and "Did you mean 'q_proj'?" in msg
    assert "down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj" in msg and "\n" not in msg
    with pytest.raises(ConfigError, match="lora.target_modules is empty"):
        load_config(None, ["lora.target_modules=[]"])
