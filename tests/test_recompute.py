"""Activation checkpointing (``train.activation_checkpointing``): the same gradient, far fewer saved activations.

The shared-prefix cache is what makes this non-trivial: a recomputed layer must see the same keys as its first run
(turnrl.models.prefix.PrefixCache), so each case runs with a shared prefix, and with and without the no-grad prompt.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.test_learner import _samples
from tests.test_speed_options import _grads, _params
from turnrl.learner.learner import response_hidden, response_logits
from turnrl.learner.samples import collate
from turnrl.models.freeze import FreezeError, decoder_layers
from turnrl.models import recompute
from turnrl.models.recompute import checkpoint_layers, is_checkpointed, wanted


@pytest.mark.parametrize("prompt_grad", ["true", "false"])
@pytest.mark.parametrize("prefix_len", [24, 0])
def test_checkpointed_layers_give_the_plain_gradient(tiny_model, prompt_grad, prefix_len):
    samples = _samples(n=6, prefix_len=prefix_len)
    plain = _grads(copy.deepcopy(tiny_model), samples, _params(prompt_grad=prompt_grad))
    model = copy.deepcopy(tiny_model)
    assert not is_checkpointed(model)
    assert checkpoint_layers(model) == len(decoder_layers(model)) and is_checkpointed(model)
    recomputed = _grads(model, samples, _params(prompt_grad=prompt_grad))
    assert plain.keys() == recomputed.keys()
    for name in plain:
        assert torch.allclose(plain[name], recomputed[name], atol=1e-6, rtol=1e-5), name


def _saved_bytes(model, batch) -> int:
    """Bytes of activations (not weights) autograd saves for the backward of the decoder's forward over ``batch``."""
    weights = {p.data_ptr() for p in model.parameters()}
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        if t.data_ptr() not in weights:
            total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        response_hidden(model, batch).sum()
    return total


def test_checkpointed_layers_save_a_fraction_of_the_activations(tiny_model):
    batch = collate(_samples(n=6, prefix_len=24), pad_id=0, min_shared_prefix=4)
    plain = _saved_bytes(copy.deepcopy(tiny_model), batch)
    model = copy.deepcopy(tiny_model)
    checkpoint_layers(model)
    assert _saved_bytes(model, batch) < 0.3 * plain


def test_checkpointing_is_idempotent_and_leaves_parameter_names_and_no_grad_forwards_alone(tiny_model):
    model = copy.deepcopy(tiny_model)
    names = [n for n, _ in model.named_parameters()]
    batch = collate(_samples(n=4, prefix_len=16), pad_id=0, min_shared_prefix=4)
    with torch.no_grad():
        before = response_logits(model, batch)
    checkpoint_layers(model)
    checkpoint_layers(model)  # a second call wraps nothing twice
    assert [n for n, _ in model.named_parameters()] == names
    with torch.no_grad():
        assert torch.equal(response_logits(model, batch), before)


def test_a_model_without_decoder_layers_is_refused_with_the_fix():
    with pytest.raises(FreezeError, match="train.activation_checkpointing=false"):
        checkpoint_layers(torch.nn.Linear(2, 2))


def test_training_run_with_activation_checkpointing(tmp_path, tokenizer):
    from tests.test_train import _run
    from turnrl.monitor.sinks import read_metrics

    run_dir, c = _run(tmp_path, tokenizer, ["train.activation_checkpointing=true", "eval.every=0", "eval.at_start=false"],
                      "recompute", steps=2)
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]
    assert is_checkpointed(c.model)


def test_auto_turns_checkpointing_on_below_16_gb_of_memory_only(tiny_model, monkeypatch):
    assert wanted(True, tiny_model) and not wanted(False, tiny_model)
    monkeypatch.setattr(recompute, "memory_gb", lambda: 7.6)  # an 8 GB laptop
    assert wanted("auto", tiny_model)
    assert not wanted("auto", torch.nn.Linear(2, 2))  # auto skips a model without decoder layers; true would refuse it
    monkeypatch.setattr(recompute, "memory_gb", lambda: 24.0)
    assert not wanted("auto", tiny_model)


def test_memory_gb_is_this_machines_memory():
    import os

    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    assert 0 < recompute.memory_gb() <= ram


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_of_a_checkpointed_model_stay_checkpointed_and_exact(tiny_model, how):
    import pickle

    samples = _samples(n=4, prefix_len=16)
    plain = _grads(copy.deepcopy(tiny_model), samples, _params())
    model = copy.deepcopy(tiny_model)
    checkpoint_layers(model)
    twin = copy.deepcopy(model) if how == "deepcopy" else pickle.loads(pickle.dumps(model))  # learner ranks get a pickle
    assert is_checkpointed(twin)
    assert all(layer.forward.layer is layer for layer in decoder_layers(twin))  # bound to the copy, not the original
    batch = collate(samples, pad_id=0, min_shared_prefix=4)
    assert _saved_bytes(twin, batch) < 0.3 * _saved_bytes(copy.deepcopy(tiny_model), batch)
    recomputed = _grads(twin, samples, _params())
    for name in plain:
        assert torch.allclose(plain[name], recomputed[name], atol=1e-6, rtol=1e-5), name
