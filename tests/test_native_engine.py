"""The native engine: equality with HF greedy decoding, exact logprobs, cache reuse across turns, scheduling."""

import asyncio

import pytest
import torch

from turnrl.engines import SamplingParams
from turnrl.engines.native import NativeEngine, UnsupportedModelError
from turnrl.envs import make
from turnrl.agent import ContextSpec
from turnrl.rollout import Collector

from tests.test_engine import _hf_greedy, _prompts

GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)


def _recomputed_logprobs(model, prompt, completion, temperature):
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def test_greedy_equals_hf_generate_fp32(tokenizer, tiny_model):
    prompts = _prompts(tokenizer)
    engine = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_slots=8, max_len=512)
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0.0))
    for p, o in zip(prompts, outs):
        assert o.token_ids == _hf_greedy(tiny_model, p, 8)[: len(o.token_ids)]
    assert engine.counters["reused_tokens"] > 0  # the shared head came from the prefix store


def test_logprobs_match_learner_recomputation_fp32(tokenizer, tiny_model):
    prompts = _prompts(tokenizer)
    engine = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_len=512, seed=3)
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.7))
    diffs = [(_recomputed_logprobs(tiny_model, p, o.token_ids, 0.7) - torch.tensor(o.logprobs)).abs().mean().item()
             for p, o in zip(prompts, outs)]
    assert max(diffs) <= 1e-4


def test_bf16_logprobs_are_close(tokenizer, tiny_model):
    prompts = _prompts(tokenizer)
    engine = NativeEngine(tiny_model, tokenizer, dtype="bf16", max_len=512, seed=3)
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=1.0))
    diffs = [(_recomputed_logprobs(tiny_model, p, o.token_ids, 1.0) - torch.tensor(o.logprobs)).abs().mean().item()
             for p, o in zip(prompts, outs)]
    assert max(diffs) < 0.05  # bf16 weights and activations; the measured figure is in bench/RESULTS.md


@pytest.mark.parametrize("dtype,tol", [("fp32", 1e-4), ("bf16", 0.05)])
def test_packed_weights_change_no_result(tokenizer, tiny_model, dtype, tol):
    """oneDNN-packed weights are a layout, not an approximation: same greedy tokens, logprobs within the dtype's noise."""
    prompts = _prompts(tokenizer)
    packed = NativeEngine(tiny_model, tokenizer, dtype=dtype, max_len=512)
    plain = NativeEngine(tiny_model, tokenizer, dtype=dtype, max_len=512, packed_weights=False)
    if not packed.packed_weights:
        pytest.skip("this torch build has no oneDNN weight packing")
    assert packed._w.lm_head.is_mkldnn and not plain._w.lm_head.is_mkldnn
    a = packed.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.0))
    b = plain.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.0))
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert max(abs(x - y) for oa, ob in zip(a, b) for x, y in zip(oa.logprobs, ob.logprobs)) <= tol


def test_prefill_in_row_chunks_changes_no_result(tokenizer, tiny_model):
    prompts = _prompts(tokenizer) * 2
    sp = SamplingParams(max_new_tokens=5, temperature=0.0)
    whole = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_slots=16).generate(prompts, sp)
    chunked_engine = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_slots=16, prefill_tokens=8)
    calls = []
    real = chunked_engine._forward
    # prefill rows (more than one new token) per pass; decode rows ride along in the first chunk's pass
    chunked_engine._forward = lambda slots, news, *a, **k: calls.append(sum(len(n) > 1 for n in news)) or real(slots, news, *a, **k)
    chunked = chunked_engine.generate(prompts, sp)
    assert calls and max(calls) == 1  # one prompt per prefill pass
    for a, b in zip(whole, chunked):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def test_extended_cache_gives_the_logits_of_a_fresh_prefill(tokenizer, tiny_model):
    """Turn 1 in a sequence, then observation tokens appended: the logits equal a fresh prefill of everything."""
    p = _prompts(tokenizer)[0]
    obs = tokenizer("<|im_end|>\n<|im_start|>user\nFFPH\nFHFF<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    engine = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_len=512)
    seq = engine.open()
    first = asyncio.run(engine.agenerate(seq, p, GREEDY))
    convo = p + first.token_ids + obs
    before = engine.counters["prefill_tokens"]
    slot = engine._seqs[seq].slot
    logits = engine._forward([slot], [convo[len(p) + len(first.token_ids) - 1 :]], [len(p) + len(first.token_ids) - 1])
    assert engine.counters["prefill_tokens"] == before
    fresh = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_len=512)
    s2 = fresh.open()
    fresh._assign_slot(fresh._seqs[s2])
    ref = fresh._forward([fresh._seqs[s2].slot], [convo], [0])
    with torch.no_grad():
        hf = tiny_model(torch.tensor([convo])).logits[0, -1]
    assert torch.allclose(logits[0], ref[0], atol=1e-4)
    assert torch.allclose(logits[0], hf, atol=1e-4)


def test_second_turn_prefills_only_the_new_tokens(tokenizer, tiny_model):
    p = _prompts(tokenizer)[1]
    engine = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_len=512)
    seq = engine.open()
    first = asyncio.run(engine.agenerate(seq, p, GREEDY))
    obs = tokenizer("\nnext observation\n", add_special_tokens=False)["input_ids"]
    before = engine.counters["prefill_tokens"]
    second = asyncio.run(engine.agenerate(seq, p + first.token_ids + obs, GREEDY))
    assert engine.counters["prefill_tokens"] - before == len(obs) + 1  # the last sampled token was never fed
    assert second.token_ids == _hf_greedy(tiny_model, p + first.token_ids + obs, 6)[: len(second.token_ids)]


def test_rows_do_not_depend_on_batch_company(tokenizer, tiny_model):
    """Each sequence has its own generator: alone or batched with others, it samples the same tokens."""
    prompts = _prompts(tokenizer)
    params = SamplingParams(max_new_tokens=5, temperature=1.0)
    batched = NativeEngine(tiny_model, tokenizer, dtype="fp32", seed=7).generate(prompts, params)
    for i, p in enumerate(prompts):
        engine = NativeEngine(tiny_model, tokenizer, dtype="fp32", seed=7)
        for _ in range(i):
            engine.open()  # same opening order as in the batch
        assert engine.generate([p], params)[0].token_ids == batched[i].token_ids


def test_eviction_when_slots_run_out(tokenizer, tiny_model):
    prompts = _prompts(tokenizer)
    engine = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_slots=2, max_len=512)
    seqs = [engine.open() for _ in prompts]

    async def turns():
        return await asyncio.gather(*(engine.agenerate(s, p, GREEDY) for s, p in zip(seqs, prompts)))

    outs = asyncio.run(turns())
    for p, o in zip(prompts, outs):
        assert o.token_ids == _hf_greedy(tiny_model, p, 6)[: len(o.token_ids)]
    assert engine.counters["evictions"] >= 2


def test_stop_strings_tokens_and_sync(tokenizer, tiny_model):
    prompts = _prompts(tokenizer)
    engine = NativeEngine(tiny_model, tokenizer, dtype="fp32")
    first = engine.generate(prompts, SamplingParams(max_new_tokens=3, temperature=0.0))
    stop_tok = first[0].token_ids[1]
    out = engine.generate(prompts[:1], SamplingParams(max_new_tokens=3, temperature=0.0, stop_token_ids=(stop_tok,)))[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] == stop_tok
    text = tokenizer.decode(first[0].token_ids[:2])
    out = engine.generate(prompts[:1], SamplingParams(max_new_tokens=3, temperature=0.0, stop_strings=(text,)))[0]
    assert out.finish_reason == "stop" and len(out.token_ids) <= 2
    with torch.no_grad():
        tiny_model.lm_head.weight.mul_(-1.0)  # the learner changed; the engine samples the new weights after sync
    engine.sync_weights()
    changed = engine.generate(prompts, SamplingParams(max_new_tokens=3, temperature=0.0))
    assert changed[0].version == 1
    assert [c.token_ids for c in changed] == [_hf_greedy(tiny_model, p, 3)[: len(c.token_ids)] for p, c in zip(prompts, changed)]


def test_rejects_unsupported_models_and_long_prompts(tokenizer, tiny_model):
    tiny_model.config.model_type = "gpt2"
    with pytest.raises(UnsupportedModelError, match="engine=hf"):
        NativeEngine(tiny_model, tokenizer)
    tiny_model.config.model_type = "llama"
    engine = NativeEngine(tiny_model, tokenizer, max_len=32)
    with pytest.raises(ValueError, match="max_len"):
        engine.generate([list(range(40))], GREEDY)


@pytest.mark.parametrize("context", ["per_step", "full"])
def test_collector_with_native_engine_matches_hf_engine_greedy(tokenizer, tiny_model, context):
    """Same greedy episodes through the lock-step HF path and the continuous native path."""
    from turnrl.engines import HFEngine

    ctx = ContextSpec(strategy=context)
    env_factory = lambda: make("frozenlake-v0", max_turns=3)  # noqa: E731
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    ref = Collector(HFEngine(tiny_model, tokenizer), tokenizer, env_factory, ctx).collect([0, 1], 2, params)
    native = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_len=1024)
    got = Collector(native, tokenizer, env_factory, ctx).collect([0, 1], 2, params)
    for gr, gg in zip(ref, got):
        for a, b in zip(gr.trajectories, gg.trajectories):
            assert [t.prompt_ids for t in a.turns] == [t.prompt_ids for t in b.turns]
            assert [t.response_ids for t in a.turns] == [t.response_ids for t in b.turns]
            assert a.termination == b.termination
    if context == "full":  # every turn after the first prefilled only the env's answer
        assert native.counters["reused_tokens"] > native.counters["prefill_tokens"]
