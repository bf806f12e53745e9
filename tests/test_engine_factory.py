"""make_engine: which backend each kind builds, with which arguments, and the auto fallback."""

import pytest
import torch

from turnrl.engines import HFEngine, OpenAICompatEngine, make_engine
from turnrl.engines.native import NativeEngine, UnsupportedModelError


@pytest.fixture
def gpt2(tokenizer):
    """A model outside the Llama family, which only the HF engine runs."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=len(tokenizer)))


def test_auto_picks_native_for_a_llama_model(tokenizer, tiny_model, capsys):
    engine = make_engine("auto", tiny_model, tokenizer, bf16=False, seed=3, max_slots=5, max_len=128)
    assert isinstance(engine, NativeEngine)
    assert (engine.dtype, engine.seed, engine.max_slots, engine.max_len) == (torch.float32, 3, 5, 128)
    assert make_engine("auto", tiny_model, tokenizer).dtype == torch.bfloat16
    assert capsys.readouterr().err == ""


def test_train_threads_caps_the_native_engine_threads(tokenizer, tiny_model):
    """train.threads=1 must hold while the native engine runs: two single-threaded runs side by side on a 2-core machine
    would otherwise each start as many threads as the machine has cores and oversubscribe it."""
    from turnrl.build import build
    from turnrl.config import load_config

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        cfg = load_config(overrides=["train.threads=1", "rollout.engine=native", "model.autocast_bf16=false"])
        c = build(cfg, model=tiny_model, tokenizer=tokenizer)
        assert isinstance(c.engine, NativeEngine) and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_auto_falls_back_to_hf_and_says_so(tokenizer, gpt2, capsys):
    engine = make_engine("auto", gpt2, tokenizer, bf16=True, seed=3)
    assert isinstance(engine, HFEngine) and engine.autocast_bf16
    assert engine.generator.initial_seed() == 3
    err = capsys.readouterr().err
    assert err.startswith("rollout.engine=auto: the native engine runs the Llama family")
    assert err.rstrip().endswith("; generating with the HF engine")


def test_native_on_an_unsupported_model_raises(tokenizer, gpt2):
    with pytest.raises(UnsupportedModelError, match="engine=hf"):
        make_engine("native", gpt2, tokenizer)


def test_hf_is_the_reference_engine_even_for_a_llama_model(tokenizer, tiny_model):
    engine = make_engine("hf", tiny_model, tokenizer, bf16=False)
    assert isinstance(engine, HFEngine) and not engine.autocast_bf16


def test_unknown_kind_and_stray_options_are_errors(tokenizer, tiny_model):
    with pytest.raises(ValueError, match="'sglang'.*auto, hf, native, vllm, openai"):
        make_engine("sglang", tiny_model, tokenizer)
    with pytest.raises(ValueError, match="takes no options.*base_url"):
        make_engine("hf", tiny_model, tokenizer, base_url="http://localhost:8000/v1")


def test_openai_takes_its_server_from_options(tokenizer):
    engine = make_engine("openai", tokenizer=tokenizer, seed=5, base_url="http://localhost:8000", api_model="m",
                         endpoint="chat", api_key="k", vllm_extensions=False, require_logprobs=False)
    assert isinstance(engine, OpenAICompatEngine)
    assert (engine.base_url, engine.model, engine.endpoint, engine.api_key) == ("http://localhost:8000/v1", "m", "chat", "k")
    assert not engine.vllm_extensions and not engine.require_logprobs
    assert engine.state_dict() == OpenAICompatEngine("http://x", "m", tokenizer, seed=5).state_dict()
    with pytest.raises(ValueError, match="base_url= and api_model="):
        make_engine("openai", tokenizer=tokenizer, base_url="http://localhost:8000")


def test_vllm_syncs_from_the_learner_when_given_one(monkeypatch, tiny_model):
    built = []
    monkeypatch.setattr("turnrl.engines.vllm_engine.VLLMEngine", lambda *a, **k: built.append((a, k)) or "engine")
    monkeypatch.setattr("turnrl.models.resolve_model_path", lambda p: f"/models/{p}")
    assert make_engine("vllm", tiny_model, model_path="default", seed=2) == "engine"
    assert make_engine("vllm", model_path="./served", seed=2) == "engine"  # eval only: no learner
    assert built == [(("/models/default",), {"learner_model": tiny_model, "seed": 2}), (("./served",), {"seed": 2})]
