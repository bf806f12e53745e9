"""The learner's memory savings (issue 22, item 3) leave the update's result unchanged.

AdamW runs fused (one kernel per parameter, no temporaries the size of all parameters), and the heap is trimmed after
each update: neither may move the weights beyond floating-point noise from the foreach AdamW they replace. Grouped-query
attention runs without a copy of the keys and values per query head, the shared prefix is stored once, and the native
engine frees its weights while the learner updates: each saves memory and changes no result.
"""

from __future__ import annotations

import copy

import pytest
import torch

from types import SimpleNamespace

from tests.test_learner import _samples
from tests.test_recompute import _saved_bytes
from tests.test_speed_options import _grads, _params
from turnrl import loop
from turnrl.learner import Learner
from turnrl.learner import heap
from turnrl.learner import learner as learner_module
from turnrl.learner.learner import response_logits
from turnrl.learner.samples import collate
from turnrl.models.attention import NAME
from turnrl.models.prefix import PrefixCache, prefix_cache
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
    heap.release_free_memory()
    heap.release_free_memory()


def test_an_update_trims_the_heap_before_it_after_each_micro_batch_and_at_its_end(tiny_model, monkeypatch):
    trims: list[int] = []
    monkeypatch.setattr(learner_module, "release_free_memory", lambda: trims.append(1))
    learner = Learner(copy.deepcopy(tiny_model), _params(micro_batch_tokens=64), pad_id=0)
    metrics = learner.update(_samples(n=6, prefix_len=24))
    assert metrics["train/micro_batches"] >= 2
    assert len(trims) == metrics["train/micro_batches"] + 2


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


def _with_transformers_sdpa(model):
    plain = copy.deepcopy(model)
    plain.set_attn_implementation("sdpa")
    return plain


def test_models_turnrl_builds_run_grouped_attention(tiny_model):
    assert tiny_model.config._attn_implementation == NAME
    assert tiny_model.config.num_key_value_heads < tiny_model.config.num_attention_heads  # grouped: the case it serves


def test_grouped_attention_gives_transformers_sdpa_logits_and_gradient(tiny_model):
    samples = _samples(n=6, prefix_len=24)
    batch = collate(samples, pad_id=0, min_shared_prefix=4)
    plain = _with_transformers_sdpa(tiny_model)
    assert torch.allclose(response_logits(tiny_model, batch), response_logits(plain, batch), atol=1e-5, rtol=0)
    grouped, reference = _grads(copy.deepcopy(tiny_model), samples, _params()), _grads(plain, samples, _params())
    for name in reference:
        assert torch.allclose(grouped[name], reference[name], atol=1e-6, rtol=1e-5), name


def test_grouped_attention_saves_no_copy_of_the_keys_per_query_head(tiny_model):
    batch = collate(_samples(n=6, prefix_len=24), pad_id=0, min_shared_prefix=4)
    cfg = tiny_model.config
    rows, keys = batch.attention.shape
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    # saved for the backward: keys and values per query head (repeat_kv's copy) or per key/value head, every layer
    per_head = 2 * rows * keys * head_dim * 4 * cfg.num_hidden_layers
    saved = _saved_bytes(copy.deepcopy(tiny_model), batch)
    extra = per_head * (cfg.num_attention_heads - cfg.num_key_value_heads)
    assert _saved_bytes(_with_transformers_sdpa(tiny_model), batch) - saved == extra


def test_the_shared_prefix_is_stored_once_and_broadcast_in_each_layer(tiny_model):
    batch = collate(_samples(n=6, prefix_len=24), pad_id=0, min_shared_prefix=4)
    cache = prefix_cache(tiny_model, batch.prefix)
    assert isinstance(cache, PrefixCache) and all(layer.keys.shape[0] == 1 for layer in cache.layers)
    cache.freeze()
    keys, values = cache.update(torch.zeros(6, 2, 3, 16), torch.zeros(6, 2, 3, 16), 0)
    assert keys.shape == (6, 2, len(batch.prefix) + 3, 16) and values.shape == keys.shape
    assert cache.layers[0].keys.shape[0] == 1  # frozen: nothing stored


def _loop_parts(async_mode: bool, events: list[str]):
    engine = SimpleNamespace(release_weights=lambda: events.append("release"))
    learner = SimpleNamespace(update=lambda samples, values, demos: events.append("update") or {"train/loss": 0.0})
    cfg = SimpleNamespace(scale=SimpleNamespace(async_mode=async_mode))
    return SimpleNamespace(cfg=cfg, engine=engine, learner=learner, model=torch.nn.Linear(2, 2))


def test_a_synchronous_loop_frees_the_engines_weights_before_the_update_and_an_async_one_never():
    events: list[str] = []
    metrics, broken = loop.learn(_loop_parts(False, events), [], None)
    assert events == ["release", "update"] and broken is None and metrics == {"train/loss": 0.0}
    events.clear()
    loop.learn(_loop_parts(True, events), [], None)  # the producer thread is sampling from those weights meanwhile
    assert events == ["update"]


def test_the_heap_threshold_is_fixed_under_activation_checkpointing_by_default(tiny_model, monkeypatch):
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(heap, "_glibc", lambda: SimpleNamespace(mallopt=lambda k, v: calls.append((k, v))))
    Learner(copy.deepcopy(tiny_model), _params(), pad_id=0)  # not checkpointed: glibc's own threshold
    assert calls == []
    model = copy.deepcopy(tiny_model)
    checkpoint_layers(model)
    assert Learner(model, _params(), pad_id=0).heap_mmap_threshold_kb == 4096
    assert Learner(copy.deepcopy(tiny_model), _params(heap_mmap_threshold_kb=256), pad_id=0).heap_mmap_threshold_kb == 256
    assert calls == [(-3, 4096 * 1024), (-3, 256 * 1024)]  # M_MMAP_THRESHOLD, in bytes
    with pytest.raises(Exception, match="heap_mmap_threshold_kb"):
        _params(heap_mmap_threshold_kb=-1)


def test_every_weights_gradient_is_in_grad_before_the_shared_prefixs_backward_runs(tiny_model, monkeypatch):
    """The prefix's backward is deferred (turnrl.models.prefix.deferred): autograd no longer holds a second copy of
    the gradient in its buffers, waiting for the prefix's share; the sum is the same (tests/test_learner.py)."""
    seen: list[bool] = []
    backward = torch.autograd.backward

    def recording(tensors, grad_tensors=None, *args, **kwargs):
        seen.append(all(p.grad is not None for p in tiny_model.model.layers.parameters()))
        return backward(tensors, grad_tensors, *args, **kwargs)

    monkeypatch.setattr(torch.autograd, "backward", recording)
    batch = collate(_samples(n=6, prefix_len=24), pad_id=0, min_shared_prefix=4)
    assert batch.prefix
    response_logits(tiny_model, batch).logsumexp(-1).sum().backward()
    assert seen == [False, True]  # the loss's backward, then the prefix's, inside it, once every layer's is in .grad


def test_bench_memory_phases_counts_the_tensors_alive_and_their_peak():
    from tests.bench_modules import load_bench

    weights = torch.ones(10)
    with load_bench("memory_phases").LiveTensors({weights.untyped_storage().data_ptr()}) as live:
        kept = torch.ones(1000) + weights.sum()  # 4,000 bytes (the sum's and the ones' temporaries are freed)
        dropped = torch.ones(2000)
        del dropped
        _ = weights.mul_(2)  # in place on a storage it skips: not counted
    assert live.now == 4000 and live.peak >= 4000 + 8000
    assert sum(live.at_peak.values()) == live.peak and kept.numel() == 1000
