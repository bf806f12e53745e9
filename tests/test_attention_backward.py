"""Grouped attention's bf16 backward (turnrl.models.attention._MatmulBackward) against torch's flash kernel.

The forward is the kernel itself, so the output must be the kernel's bit for bit; the gradients must be as close to an
fp64 reference as the kernel's own bf16 gradients are. In a learner update under bf16 autocast the gradient must
agree with transformers' own sdpa attention to bf16 rounding.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from tests.test_learner import _samples
from tests.test_speed_options import _grads
from turnrl.config import load_config
from turnrl.learner import LearnerParams
from turnrl.models.attention import _MatmulBackward, grouped_sdpa
from turnrl.models.recompute import checkpoint_layers


def _inputs(rows: int, queries: int, keys: int, per_head_mask: bool, seed: int = 0, boolean: bool = False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, 6, queries, 16, generator=g)
    k, v = torch.randn(rows, 2, keys, 16, generator=g), torch.randn(rows, 2, keys, 16, generator=g)
    allowed = torch.ones(queries, keys, dtype=torch.bool)
    allowed[:, keys - queries:] = torch.tril(torch.ones(queries, queries, dtype=torch.bool))  # causal after a prefix
    allowed = allowed.expand(rows, 6 if per_head_mask else 1, queries, keys).clone()
    allowed[0, :, :, :3] = False  # a padded row: its first keys are padding
    if boolean:  # as transformers builds them; one query may see no key at all (the kernel outputs 0 there)
        allowed[-1, :, 1, :] = False
        return q, k, v, allowed, torch.randn(rows, 6, queries, 16, generator=g)
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.bfloat16).min)
    return q, k, v, mask, torch.randn(rows, 6, queries, 16, generator=g)


def _gradients(attend, q, k, v, mask, grad_out):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = attend(q, k, v, mask)
    out.backward(grad_out.to(out.dtype))
    return out.detach(), [t.grad.double() for t in (q, k, v)]


def _kernel(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def _ours(q, k, v, mask):
    return _MatmulBackward.apply(q, k, v, mask, None)


@pytest.mark.parametrize("per_head_mask, boolean", [(False, False), (True, False), (False, True), (True, True)])
def test_the_bf16_backward_is_as_close_to_exact_as_the_flash_kernels(per_head_mask, boolean):
    q, k, v, mask, grad_out = _inputs(rows=3, queries=5, keys=12, per_head_mask=per_head_mask, boolean=boolean)
    _, exact = _gradients(_kernel, *(t if t.dtype == torch.bool else t.double() for t in (q, k, v, mask, grad_out)))
    low = [t if t.dtype == torch.bool else t.bfloat16() for t in (q, k, v, mask)]
    kernel_out, kernel = _gradients(_kernel, *low, grad_out)
    ours_out, ours = _gradients(_ours, *low, grad_out)
    assert torch.equal(ours_out, kernel_out)  # the forward is the kernel's
    assert all(torch.isfinite(g).all() for g in ours)  # a query that sees no key gets no NaN
    for name, a, b, e in zip("qkv", ours, kernel, exact):
        ours_err, kernel_err = float((a - e).norm() / e.norm()), float((b - e).norm() / e.norm())
        assert ours_err < 1e-2, name  # bf16 rounding, not a wrong formula (that would be O(1))
        assert ours_err <= 1.5 * kernel_err + 1e-3, (name, ours_err, kernel_err)


def test_grouped_attention_takes_the_matmul_backward_only_where_it_trains_in_bf16():
    q, k, v, mask, _ = _inputs(rows=2, queries=4, keys=9, per_head_mask=False)
    module = type("Attention", (), {"num_key_value_groups": 3})()
    q.requires_grad_()

    def backward_name(enabled: bool = True) -> str:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):  # the mask in the compute dtype, as built
            out, _ = grouped_sdpa(module, q, k, v, mask.bfloat16() if enabled else mask)
        names, node = [], out.grad_fn
        while node is not None and len(names) < 4:  # the output's transpose and copy, then the attention's own node
            names.append(type(node).__name__)
            node = node.next_functions[0][0] if node.next_functions else None
        return " ".join(names) or "none"

    assert "MatmulBackward" in backward_name()
    assert "Flash" in backward_name(enabled=False)  # fp32: torch's kernel
    with torch.no_grad():
        assert backward_name() == "none"


@pytest.mark.parametrize("recompute", [False, True])
def test_a_bf16_update_through_grouped_attention_matches_transformers_sdpa(tiny_model, recompute):
    """Several micro-batches, so the batch's prefix runs once and its keys take gradients from each; with activation
    checkpointing the attention's forward runs again inside the backward."""
    samples = _samples(n=6, prefix_len=24)
    params = LearnerParams.from_config(load_config(overrides=["model.autocast_bf16=true", "algo.estimator=grpo",
                                                              "train.micro_batch_tokens=64"]))
    model, plain = copy.deepcopy(tiny_model), copy.deepcopy(tiny_model)
    plain.set_attn_implementation("sdpa")
    if recompute:
        checkpoint_layers(model)
    ours, reference = _grads(model, samples, params), _grads(plain, samples, params)
    assert set(ours) == set(reference)
    x = torch.cat([ours[n].flatten() for n in sorted(ours)])
    y = torch.cat([reference[n].flatten() for n in sorted(ours)])
    assert float(x @ y / (x.norm() * y.norm())) > 0.999
    assert float((x - y).norm() / y.norm()) < 0.05
    for name in [n for n in ours if "q_proj" in n or "k_proj" in n]:  # their gradients come only through dQ and dK
        assert float((ours[name] - reference[name]).norm() / reference[name].norm()) < 0.05, name
