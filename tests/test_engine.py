import random

import torch

from turnrl.engines import Engine, HFEngine, SamplingParams, SessionEngine
from turnrl.engines.base import SeedStreamState
from turnrl.models.prefix import common_prefix_len


def _prompts(tokenizer):
    head = [{"role": "system", "content": "You play a grid game. Answer with Left, Down, Right or Up. " * 3}]
    qs = ["PFFH\nFHFF\nFFFG", "SFFF\nFHPH\nFFFG\nwhich way?", "hello", "What is 2+2?"]
    return [
        tokenizer(tokenizer.apply_chat_template(head + [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False),
                  add_special_tokens=False)["input_ids"]
        for q in qs
    ]


def _hf_greedy(model, prompt, n):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=[])
    return out[0, len(prompt):].tolist()


def test_greedy_matches_hf_generate_with_shared_prefix(tokenizer, tiny_model):
    prompts = _prompts(tokenizer)
    assert common_prefix_len(prompts) >= 16  # the shared-prefix path is exercised
    engine = HFEngine(tiny_model, tokenizer)
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.0))
    for p, o in zip(prompts, outs):
        ref = _hf_greedy(tiny_model, p, 6)
        assert o.token_ids == ref[: len(o.token_ids)]


def test_batched_equals_one_by_one(tokenizer, tiny_model):
    prompts = _prompts(tokenizer)
    engine = HFEngine(tiny_model, tokenizer)
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    batched = engine.generate(prompts, params)
    single = [engine.generate([p], params)[0] for p in prompts]
    for a, b in zip(batched, single):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def test_prefill_in_row_chunks_gives_the_same_completions(tokenizer, tiny_model):
    """A small prefill budget (one row per forward) merges the chunks' caches: same tokens and logprobs."""
    prompts = _prompts(tokenizer) * 2
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    whole = HFEngine(tiny_model, tokenizer).generate(prompts, params)
    chunked_engine = HFEngine(tiny_model, tokenizer, prefill_tokens=8)
    calls = []
    real_forward = tiny_model.forward

    def counting(*args, **kwargs):
        calls.append(kwargs.get("input_ids", args[0] if args else None).shape)
        return real_forward(*args, **kwargs)

    tiny_model.forward = counting
    try:
        chunked = chunked_engine.generate(prompts, params)
    finally:
        del tiny_model.forward
    assert sum(1 for shape in calls if shape[1] > 1) >= len(prompts)  # one prefill forward per row (+ the prefix)
    for a, b in zip(whole, chunked):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def test_behaviour_logprobs_match_recomputation(tokenizer, tiny_model):
    prompts = _prompts(tokenizer)
    engine = HFEngine(tiny_model, tokenizer, seed=3)
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.7))
    diffs = []
    for p, o in zip(prompts, outs):
        ids = torch.tensor([p + o.token_ids])
        with torch.no_grad():
            logits = tiny_model(ids).logits[0, len(p) - 1 : -1].float() / 0.7
        lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(o.token_ids)[:, None]).squeeze(-1)
        diffs.append((lp - torch.tensor(o.logprobs)).abs().mean().item())
    assert max(diffs) <= 1e-4


def test_sampling_is_seeded_and_top_k_restricts(tokenizer, tiny_model):
    prompts = _prompts(tokenizer)
    params = SamplingParams(max_new_tokens=4, temperature=1.0)
    a = HFEngine(tiny_model, tokenizer, seed=1).generate(prompts, params)
    b = HFEngine(tiny_model, tokenizer, seed=1).generate(prompts, params)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    # top_k=1 is greedy whatever the temperature
    greedy = HFEngine(tiny_model, tokenizer).generate(prompts, SamplingParams(max_new_tokens=4, temperature=0.0))
    k1 = HFEngine(tiny_model, tokenizer, seed=5).generate(prompts, SamplingParams(max_new_tokens=4, temperature=1.5, top_k=1))
    assert [x.token_ids for x in greedy] == [x.token_ids for x in k1]


def test_stop_token_ends_turn_and_length_is_reported(tokenizer, tiny_model):
    prompts = _prompts(tokenizer)
    engine = HFEngine(tiny_model, tokenizer)
    first = engine.generate(prompts, SamplingParams(max_new_tokens=3, temperature=0.0))
    stop_tok = first[0].token_ids[1]
    outs = engine.generate(prompts[:1], SamplingParams(max_new_tokens=3, temperature=0.0, stop_token_ids=(stop_tok,)))
    assert outs[0].finish_reason == "stop" and outs[0].token_ids[-1] == stop_tok
    assert all(o.finish_reason == "length" and len(o.token_ids) == 3 for o in first if stop_tok not in o.token_ids[:3])


def test_sync_bumps_version_and_state_roundtrip(tokenizer, tiny_model):
    engine = HFEngine(tiny_model, tokenizer, seed=2)
    state = engine.state_dict()
    p = _prompts(tokenizer)[:2]
    a = engine.generate(p, SamplingParams(max_new_tokens=3))
    engine.load_state_dict(state)
    b = engine.generate(p, SamplingParams(max_new_tokens=3))
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    engine.sync_weights()
    assert engine.generate(p, SamplingParams(max_new_tokens=1))[0].version == 1


def test_session_engines_are_told_apart_by_the_protocol(tokenizer, tiny_model):
    from turnrl.engines.native import NativeEngine

    native, hf = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_slots=2), HFEngine(tiny_model, tokenizer)
    assert isinstance(native, SessionEngine) and isinstance(native, Engine)
    assert isinstance(hf, Engine) and not isinstance(hf, SessionEngine)


def test_seed_stream_state_keeps_the_checkpoint_format():
    class Stream(SeedStreamState):
        def __init__(self, seed):
            self.version, self.rng = 0, random.Random(seed)

    a = Stream(1)
    a.version = 4
    state = a.state_dict()
    assert state == {"version": 4, "rng": random.Random(1).getstate()}
    draws = [a.rng.random() for _ in range(3)]
    b = Stream(2)
    b.load_state_dict({"version": 4, "rng": [state["rng"][0], list(state["rng"][1]), state["rng"][2]]})  # as from JSON
    assert b.version == 4 and [b.rng.random() for _ in range(3)] == draws
