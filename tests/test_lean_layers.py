"""turnrl.models.lean: the same forward as transformers' RMSNorm and SwiGLU MLP, gradients to rounding, and less kept
for the backward."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

from turnrl.models.lean import LeanEmbedding, LeanLinear, LeanMLP, LeanRMSNorm, use_lean_layers

from tests.bench_modules import load_bench


def _llama(seed: int = 0, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=97, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=96, **{"tie_word_embeddings": True, **overrides})
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # the norms start at 1: move them so their gradient and weight both matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def _run(model, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, use_cache=False).logits
    (logits.log_softmax(-1)[..., :20] * torch.linspace(-1, 1, 20)).sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def _assert_same(ref, lean, ids: torch.Tensor, exact_forward: bool = True) -> None:
    out_ref, grads_ref = _run(ref, ids)
    out_lean, grads_lean = _run(lean, ids)
    if exact_forward:
        assert torch.equal(out_ref, out_lean)
    else:
        torch.testing.assert_close(out_lean, out_ref)
    assert grads_ref.keys() == grads_lean.keys()
    for name, g in grads_ref.items():
        assert (grads_lean[name] - g).norm() <= 1e-5 * g.norm() + 1e-9, name


def test_the_lean_layers_give_the_same_logits_and_the_gradient_to_rounding():
    ref = _llama()
    lean = use_lean_layers(copy.deepcopy(ref))
    assert isinstance(lean.model.layers[0].mlp, LeanMLP) and isinstance(lean.model.norm, LeanRMSNorm)
    assert lean.state_dict().keys() == ref.state_dict().keys()
    _assert_same(ref, lean, torch.randint(0, 97, (3, 17)))


def test_a_biased_mlp_and_a_lora_wrapped_projection_take_the_path_that_keeps_the_product():
    ref = _llama(mlp_bias=True)
    _assert_same(ref, use_lean_layers(copy.deepcopy(ref)), torch.randint(0, 97, (2, 11)))

    from peft import LoraConfig, get_peft_model

    base = _llama(seed=1)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["down_proj", "gate_proj"], init_lora_weights=False)
    ref = get_peft_model(copy.deepcopy(base), lora)
    torch.manual_seed(2)
    lean = get_peft_model(use_lean_layers(copy.deepcopy(base)), lora)
    lean.load_state_dict(ref.state_dict())
    _assert_same(ref, lean, torch.randint(0, 97, (2, 11)))


def test_under_autocast_and_without_grad_the_logits_and_gradients_still_match():
    ref = _llama()
    lean = use_lean_layers(copy.deepcopy(ref))
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        assert torch.equal(ref(input_ids=ids).logits, lean(input_ids=ids).logits)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _assert_same(ref, lean, ids)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape, x_dtype", [((3, 5, 24), torch.float32), ((3, 5, 24), torch.bfloat16),
                                            ((7, 24), torch.float32)])
def test_a_linear_under_autocast_gives_autocasts_output_and_gradients_bit_for_bit(bias, shape, x_dtype):
    torch.manual_seed(0)
    ref = nn.Linear(24, 40, bias=bias)
    lean = copy.deepcopy(ref)
    lean.__class__ = LeanLinear
    x = torch.randn(shape).to(x_dtype)
    dy = torch.randn(*shape[:-1], 40).bfloat16()
    results = []
    for layer in (ref, lean):
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(xi)
        y.backward(dy)
        results.append((y, xi.grad, *(p.grad for p in layer.parameters())))
        layer.zero_grad(set_to_none=True)
    for a, b in zip(*results, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_a_linear_under_autocast_keeps_its_fp32_weight_not_a_bf16_copy():
    """What autograd saves for the backward of one projection under autocast: transformers' ``nn.Linear`` keeps a bf16
    copy of its weight (the shape of the weight, new memory); the lean one keeps the parameter itself."""
    torch.manual_seed(0)
    ref = nn.Linear(24, 40, bias=False)
    lean = copy.deepcopy(ref)
    lean.__class__ = LeanLinear
    x = torch.randn(2, 5, 24, requires_grad=True)

    def saved(layer):
        kept = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                layer(x)
        return kept

    copies = [t for t in saved(ref) if t.numel() == ref.weight.numel()]  # the copy's transpose, as mm saves it
    assert copies and all(t.dtype == torch.bfloat16 for t in copies)
    weights = [t for t in saved(lean) if t.numel() == lean.weight.numel()]
    assert len(weights) == 1 and weights[0] is lean.weight
    # outside autocast, without a gradient or with a frozen weight: the plain layer
    lean.weight.requires_grad_(False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert lean(x).grad_fn.name() != "_CastLinearBackward"


def test_the_backward_keeps_under_seven_tenths_of_what_transformers_modules_keep():
    ref = _llama()
    lean = use_lean_layers(copy.deepcopy(ref))
    ids = torch.randint(0, 97, (4, 32))

    kept = load_bench("lean_layers").kept_per_position  # bytes per position, the weights not counted
    assert kept(lean, ids) < 0.7 * kept(ref, ids)


@pytest.mark.parametrize("tied", [True, False])
def test_the_embedding_adds_its_rows_into_the_gradient_in_place(tied):
    """The lookup's gradient goes straight into ``.grad``: the same as autograd's, with the padding row left out,
    tied to the LM head or not, and summed over two backward passes (micro-batches) as autograd sums them."""
    ref = _llama(pad_token_id=0, tie_word_embeddings=tied)
    lean = use_lean_layers(copy.deepcopy(ref))
    assert type(lean.model.embed_tokens) is LeanEmbedding and lean.model.embed_tokens.padding_idx == 0
    ids = torch.randint(0, 97, (3, 13))
    ids[:, :3] = 0  # left padding
    _assert_same(ref, lean, ids)

    def two_passes(model):
        model.zero_grad(set_to_none=True)
        for part in (ids[:2], ids[2:]):
            model(input_ids=part, use_cache=False).logits.log_softmax(-1)[..., 5:9].sum().backward()
        return model.model.embed_tokens.weight.grad.clone()

    summed, summed_lean = two_passes(ref), two_passes(lean)
    if not tied:  # the padding row gets nothing (tied, the LM head's gradient reaches it)
        assert summed_lean[0].abs().sum() == 0 and summed[0].abs().sum() == 0
    assert (summed_lean - summed).norm() <= 1e-5 * summed.norm()

    lean.model.embed_tokens.weight.requires_grad_(False)  # frozen (LoRA, train.freeze_layers): the plain lookup
    lean.zero_grad(set_to_none=True)
    lean(input_ids=ids, use_cache=False).logits.sum().backward()
    assert lean.model.embed_tokens.weight.grad is None


class OtherNorm(nn.Module):
    """A norm whose formula turnrl does not know (Gemma's ``1 + weight``, say)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))
        self.variance_epsilon = 1e-6


def test_only_known_modules_are_replaced_and_the_model_pickles():
    model = _llama()
    model.extra = OtherNorm()
    model.model.layers[1].mlp.act_fn = nn.GELU()  # not SwiGLU any more
    use_lean_layers(model)
    assert type(model.extra) is OtherNorm
    assert type(model.model.layers[1].mlp).__name__ == "LlamaMLP"
    assert type(model.model.layers[0].mlp) is LeanMLP
    again = pickle.loads(pickle.dumps(model))
    assert type(again.model.layers[0].input_layernorm) is LeanRMSNorm


def test_models_turnrl_builds_use_the_lean_layers(tiny_model):
    assert isinstance(tiny_model.model.layers[0].mlp, LeanMLP)
    assert type(tiny_model.model.layers[0].self_attn.q_proj) is LeanLinear and type(tiny_model.lm_head) is LeanLinear
    assert isinstance(tiny_model.model.layers[0].post_attention_layernorm, LeanRMSNorm)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_norm_alone_matches_transformers_in_each_dtype(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    ref = LlamaRMSNorm(16, eps=1e-5).to(dtype)
    with torch.no_grad():
        ref.weight.add_(torch.randn(16).to(dtype))
    lean = LeanRMSNorm(nn.Parameter(ref.weight.detach().clone()), 1e-5)
    x = torch.randn(3, 5, 16, dtype=dtype) * 3
    dy = torch.randn(3, 5, 16, dtype=dtype)
    outs = []
    for norm in (ref, lean):
        xi = x.clone().requires_grad_(True)
        y = norm(xi)
        y.backward(dy)
        outs.append((y.detach(), xi.grad, norm.weight.grad))
    assert torch.equal(outs[0][0], outs[1][0])
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(outs[1][1], outs[0][1], **tol)
    torch.testing.assert_close(outs[1][2], outs[0][2], **tol)


def test_a_bf16_learner_update_through_the_lean_linears_gives_autocasts_gradient(tiny_model):
    """A whole update in bf16, several micro-batches and the batch's prefix run once (whose graph lives until the
    update's end): the lean linears change what the backward keeps, and the gradient at most by the order of its
    bf16 sums (here, one prompt group per micro-batch, not at all)."""
    from tests.test_learner import _samples
    from tests.test_speed_options import _grads
    from turnrl.config import load_config
    from turnrl.learner import LearnerParams

    params = LearnerParams.from_config(load_config(overrides=["model.autocast_bf16=true", "algo.estimator=grpo",
                                                              "train.micro_batch_tokens=64"]))
    samples = _samples(n=6, prefix_len=24)
    model, plain = copy.deepcopy(tiny_model), copy.deepcopy(tiny_model)
    for module in plain.modules():
        if type(module) is LeanLinear:
            module.__class__ = nn.Linear
    ours, reference = _grads(model, samples, params), _grads(plain, samples, params)
    assert set(ours) == set(reference) and len(ours) > 10
    for name, g in reference.items():
        assert (ours[name] - g).norm() <= 1e-2 * g.norm(), name
    assert sum(torch.equal(ours[n], g) for n, g in reference.items()) >= 0.9 * len(reference)


def test_a_weight_used_several_times_under_one_autocast_gets_its_gradients_summed_in_fp32():
    """Autocast casts a weight once per region, so autograd adds its uses' bf16 gradients in bf16; the lean linear
    casts each use's gradient and adds in fp32: closer to the exact (fp64) sum."""
    torch.manual_seed(0)
    ref = nn.Linear(64, 96, bias=False)
    lean, exact = copy.deepcopy(ref), copy.deepcopy(ref).double()
    lean.__class__ = LeanLinear
    xs, dys = [torch.randn(50, 64) for _ in range(4)], [torch.randn(50, 96) for _ in range(4)]
    for layer in (ref, lean):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ys = [layer(x) for x in xs]
        sum((y.float() * d).sum() for y, d in zip(ys, dys)).backward()
    sum((exact(x.double()) * d.double()).sum() for x, d in zip(xs, dys)).backward()

    def error(layer):
        return float((layer.weight.grad.double() - exact.weight.grad).norm() / exact.weight.grad.norm())

    assert error(lean) < 0.85 * error(ref)
