"""The learner's memory savings (issue 22, item 3) leave the update's result unchanged.

AdamW runs fused (one kernel per parameter, no temporaries the size of all parameters), and the heap is trimmed after
each update: neither may move the weights beyond floating-point noise from the foreach AdamW they replace.
"""

from __future__ import annotations

import copy

import torch

from tests.test_learner import _samples
from tests.test_speed_options import _params
from turnrl.learner import Learner
from turnrl.learner import learner as learner_module
from turnrl.models.recompute import checkpoint_layers


def _trained(model, optimizer_options: dict, updates: int = 3, recompute: bool = False) -> dict[str, torch.Tensor]:
    model = copy.deepcopy(model)
    if recompute:
        checkpoint_layers(model)
    learner = Learner(model, _params(lr=1e-3, weight_decay=0.1), pad_id=0)
    if optimizer_options:  # the reference: torch's default AdamW implementation over the same groups and settings
        group = learner.optimizer.param_groups[0]
        learner.optimizer = torch.optim.AdamW(group["params"], lr=group["lr"], betas=group["betas"],
                                              weight_decay=group["weight_decay"], **optimizer_options)
        learner.scheduler = torch.optim.lr_scheduler.LambdaLR(learner.optimizer, lambda s: 1.0)
    for _ in range(updates):
        learner.update(_samples(n=6, prefix_len=24))
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_the_learners_adamw_is_fused_where_torch_supports_it(tiny_model):
    learner = Learner(copy.deepcopy(tiny_model), _params(), pad_id=0)
    assert learner.optimizer.param_groups[0]["fused"] is learner_module._fused_adamw_supported()


def test_fused_adamw_gives_the_foreach_update(tiny_model):
    start = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    for recompute in (False, True):
        fused = _trained(tiny_model, {}, recompute=recompute)
        foreach = _trained(tiny_model, {"foreach": True, "fused": False}, recompute=recompute)
        assert max(float((fused[n] - start[n]).abs().max()) for n in start) > 1e-3  # the updates moved the weights
        for name in start:
            assert torch.allclose(fused[name], foreach[name], atol=1e-6, rtol=0), name


def test_trimming_the_heap_is_safe_to_call_anywhere():
    learner_module.release_free_memory()
    learner_module.release_free_memory()


def test_a_foreach_checkpoint_resumes_fused_with_the_same_update(tiny_model):
    samples = _samples(n=6, prefix_len=24)
    ref_model = copy.deepcopy(tiny_model)
    ref = Learner(ref_model, _params(lr=1e-3), pad_id=0)
    ref.optimizer.param_groups[0].update(fused=None, foreach=True)  # as a checkpoint saved before the fused default
    ref.update(samples)
    model = copy.deepcopy(ref_model)
    resumed = Learner(model, _params(lr=1e-3), pad_id=0)
    resumed.load_state_dict(copy.deepcopy(ref.state_dict()))  # the state, not tensors shared with ref
    assert resumed.optimizer.param_groups[0]["fused"] is learner_module._fused_adamw_supported()
    ref.update(samples)
    resumed.update(samples)
    for (name, a), b in zip(ref_model.named_parameters(), model.parameters()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name
