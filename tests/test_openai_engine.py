"""OpenAICompatEngine against a local stub server: both endpoints, id mapping, retries, errors, order, rollouts."""

import copy
import json
import math
import os
import random
import re
import socket
import threading
import time

import pytest

from tests.stub_openai_server import StubOpenAIServer
from turnrl.engines import Engine, SamplingParams
from turnrl.engines.openai_compat import NoLogprobsError, NotTrainableError, OpenAICompatEngine, RemoteEngineError, chatml_messages
from turnrl.envs import make
from turnrl.agent import ContextSpec
from turnrl.rollout import Collector
from turnrl.types import Termination

GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)


def _messages(q):
    return [{"role": "system", "content": "Answer with one word."}, {"role": "user", "content": q}]


def _prompt(tokenizer, q):
    text = tokenizer.apply_chat_template(_messages(q), add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _last_user(prompt_text):
    return prompt_text.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]


def _engine(server, tokenizer, **kw):
    kw.setdefault("backoff", 0.01)
    return OpenAICompatEngine(server.url, server.model, tokenizer, **kw)


def _ids(tokenizer, text):
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_completions_sends_exact_ids_and_maps_token_ids_back(tokenizer):
    with StubOpenAIServer(tokenizer, reply=lambda p: "Left and then Down") as server:
        engine = _engine(server, tokenizer, seed=7)
        assert isinstance(engine, Engine)
        prompts = [_prompt(tokenizer, "which way?"), _prompt(tokenizer, "and now?")]
        outs = engine.generate(prompts, GREEDY)
        want = _ids(tokenizer, "Left and then Down")
        for o in outs:
            assert o.token_ids == want and o.stats["ids"] == "server"
            assert o.logprobs == pytest.approx([-0.01 * (j + 1) for j in range(len(want))])
            assert o.finish_reason == "stop" and o.version == 0
        assert sorted(map(tuple, (r["prompt"] for r in server.requests))) == sorted(map(tuple, prompts))
        assert all(r["return_tokens_as_token_ids"] and r["logprobs"] == 1 and r["temperature"] == 0.0 for r in server.requests)
        seeds = [r["seed"] for r in server.requests]
        # per-request seeds are drawn from the engine's seeded stream, in input order
        again = _engine(server, tokenizer, seed=7)
        again.generate(prompts, GREEDY)
        assert sorted(r["seed"] for r in server.requests[2:]) == sorted(seeds)


def test_length_limit_is_reported(tokenizer):
    with StubOpenAIServer(tokenizer, reply=lambda p: "one two three four five six") as server:
        out = _engine(server, tokenizer).generate([_prompt(tokenizer, "count")], SamplingParams(max_new_tokens=3, temperature=0.0))[0]
        assert len(out.token_ids) == 3 and out.finish_reason == "length"


def test_text_prompts_are_the_decoded_ids(tokenizer):
    with StubOpenAIServer(tokenizer, reply=lambda p: "Up") as server:
        prompt = _prompt(tokenizer, "go")
        out = _engine(server, tokenizer, prompt_format="text").generate([prompt], GREEDY)[0]
        assert server.requests[0]["prompt"] == tokenizer.decode(prompt, skip_special_tokens=False)
        assert out.token_ids == _ids(tokenizer, "Up")


@pytest.mark.parametrize("vllm_extensions", [True, False])
def test_chat_endpoint_recovers_messages_and_ids(tokenizer, vllm_extensions):
    with StubOpenAIServer(tokenizer, reply=lambda p: "Right, then Down") as server:
        engine = _engine(server, tokenizer, endpoint="chat", vllm_extensions=vllm_extensions)
        out = engine.generate([_prompt(tokenizer, "which way?")], GREEDY)[0]
        body = server.requests[0]
        assert body["messages"] == _messages("which way?") and body["logprobs"] is True
        assert out.token_ids == _ids(tokenizer, "Right, then Down")
        # without vLLM's token-id strings the ids come from the vocabulary lookup of each piece's bytes
        assert out.stats["ids"] == ("server" if vllm_extensions else "lookup")
        assert ("return_tokens_as_token_ids" in body) == vllm_extensions
        assert out.logprobs == pytest.approx([-0.01 * (j + 1) for j in range(len(out.token_ids))])


def test_chatml_parser_rejects_what_a_chat_endpoint_cannot_continue():
    assert chatml_messages("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n") == [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match="unfinished 'assistant'"):
        chatml_messages("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhalf a")
    with pytest.raises(ValueError, match="not ChatML"):
        chatml_messages("[INST] hi [/INST]")


def test_pieces_that_do_not_map_to_one_id_are_flagged_not_guessed(tokenizer):
    """Without token-id strings, a byte-level piece like the partial UTF-8 of '☃' decodes from many ids."""
    with StubOpenAIServer(tokenizer, reply=lambda p: "snow ☃ man") as server:
        plain = _engine(server, tokenizer, vllm_extensions=False)
        with pytest.raises(NoLogprobsError, match="do not map one-to-one.*require_logprobs=False"):
            plain.generate([_prompt(tokenizer, "go")], GREEDY)
        evaluation = _engine(server, tokenizer, vllm_extensions=False, require_logprobs=False)
        out = evaluation.generate([_prompt(tokenizer, "go")], GREEDY)[0]
        assert out.stats["ids"] == "retokenized" and tokenizer.decode(out.token_ids) == "snow ☃ man"
        assert all(math.isnan(x) for x in out.logprobs)
        exact = _engine(server, tokenizer).generate([_prompt(tokenizer, "go")], GREEDY)[0]  # vLLM's token-id strings
        assert exact.stats["ids"] == "server" and exact.token_ids == _ids(tokenizer, "snow ☃ man")


def test_stop_strings_and_stop_token_ids(tokenizer):
    reply = "Left. Then Down."
    with StubOpenAIServer(tokenizer, reply=lambda p: reply) as server:
        engine = _engine(server, tokenizer)
        out = engine.generate([_prompt(tokenizer, "go")], SamplingParams(max_new_tokens=8, temperature=0.0, stop_strings=(".",)))[0]
        assert server.requests[0]["stop"] == ["."] and server.requests[0]["include_stop_str_in_output"] is True
        assert tokenizer.decode(out.token_ids) == "Left." and out.finish_reason == "stop"
        # a server that ignores stop_token_ids: the engine cuts after the first one itself
        dot = _ids(tokenizer, reply)[1]
        plain = _engine(server, tokenizer, vllm_extensions=False)
        out = plain.generate([_prompt(tokenizer, "go")], SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=(dot,)))[0]
        assert "stop_token_ids" not in server.requests[-1]
        assert out.token_ids == _ids(tokenizer, reply)[:2] and len(out.logprobs) == 2 and out.finish_reason == "stop"


@pytest.mark.parametrize("failures", [[503, 503], [429, 500]])
@pytest.mark.probe("fault")
def test_retryable_errors_back_off_then_succeed(tokenizer, failures):
    with StubOpenAIServer(tokenizer) as server:
        server.script.extend(failures)
        engine = _engine(server, tokenizer, backoff=0.05, max_backoff=1.0, max_retries=3)
        slept = []
        engine._sleep = lambda s: (slept.append(s), time.sleep(s))
        out = engine.generate([_prompt(tokenizer, "go")], GREEDY)[0]
        assert out.token_ids == _ids(tokenizer, "Right") and out.stats["attempts"] == 3
        assert len(server.requests) == 3 and len(slept) == 2
        # equal jitter: attempt k waits in [backoff * 2^k / 2, backoff * 2^k]
        assert 0.025 <= slept[0] <= 0.05 and 0.05 <= slept[1] <= 0.1
        gaps = [b - a for a, b in zip(server.request_times, server.request_times[1:])]
        assert all(g >= s * 0.9 for g, s in zip(gaps, slept))


@pytest.mark.probe("fault")
def test_a_timed_out_request_is_retried_once_then_reported(tokenizer):
    with StubOpenAIServer(tokenizer) as server:
        engine = _engine(server, tokenizer, timeout=0.5, max_retries=3)
        server.script.append(("slow", 2.0))  # a loaded server: the retry gets through
        assert engine.generate([_prompt(tokenizer, "go")], GREEDY)[0].stats["attempts"] == 2
        server.script.extend([("slow", 2.0)] * 2)  # a server that is too slow for this timeout: a third try would be too
        with pytest.raises(RemoteEngineError, match=r"no answer from http://\S+/v1/completions within 0.5 s after 2 attempts "
                                                    r"\(\d+\.\d s in all;.*raise timeout= \(now 0.5s; turnrl eval --timeout\)"):
            engine.generate([_prompt(tokenizer, "go")], GREEDY)
        assert len(server.requests) == 4


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.probe("fault")
def test_a_hanging_server_is_reported_within_two_timeouts_and_leaves_nothing_behind(tokenizer):
    """The kernel accepts the connections and takes the requests; nothing ever answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as listener:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
        engine = OpenAICompatEngine(url, "m", tokenizer, timeout=0.5, backoff=0.01, concurrency=3)  # max_retries=4
        threads, fds = threading.active_count(), _open_fds()
        t0 = time.monotonic()
        with pytest.raises(RemoteEngineError, match=r"no answer from .* within 0.5 s after 2 attempts"):
            engine.generate([[1, 2, 3]] * 3, GREEDY)
        elapsed = time.monotonic() - t0
        assert 2 * 0.5 <= elapsed < 3 * (2 * 0.5 + 0.01)  # two timeouts and one backoff, not max_retries + 1 timeouts
        # (threads and sockets of earlier tests' stub servers may still be winding down, hence <=)
        assert not [t for t in threading.enumerate() if t.name.startswith("turnrl-openai")]
        assert threading.active_count() <= threads and _open_fds() <= fds


@pytest.mark.probe("fault")
def test_a_trickling_server_hits_the_deadline_of_the_whole_response(tokenizer):
    """One byte per 0.2 s (status line and headers included) never trips a per-read timeout; the deadline ends it."""
    with StubOpenAIServer(tokenizer) as server:
        server.script.append(("trickle", 0.2))
        engine = _engine(server, tokenizer, timeout=1.0, max_retries=0)
        t0 = time.monotonic()
        with pytest.raises(RemoteEngineError, match=r"no answer from .* within 1 s after 1 attempt "):
            engine.generate([_prompt(tokenizer, "go")], GREEDY)
        assert 1.0 <= time.monotonic() - t0 < 3.0


def test_a_steady_answer_within_the_deadline_is_read_in_full(tokenizer):
    with StubOpenAIServer(tokenizer, reply=lambda p: "Left and then Down") as server:
        server.script.append(("trickle", 0.0005))  # every read returns a byte or a few: the reader must assemble them
        out = _engine(server, tokenizer, timeout=20.0).generate([_prompt(tokenizer, "go")], GREEDY)[0]
        assert out.token_ids == _ids(tokenizer, "Left and then Down") and out.stats["attempts"] == 1


_DROP = object()


def _parent(reply, keys):
    """The container holding the field at ``keys`` (dict keys and list indices), and that field's key."""
    *parents, last = keys
    for key in parents:
        reply = reply[key]
    return reply, last


def _keys(path: str) -> list:
    return [int(k) if k.isdigit() else k for k in path.split(".")]


def _with(path: str, value):
    """An edit of a valid reply: the field at a dotted ``path`` (list indices as numbers) set to ``value`` or dropped."""

    def edit(reply: dict) -> bytes:
        node, key = _parent(reply, _keys(path))
        if value is _DROP:
            del node[key]
        else:
            node[key] = value
        return json.dumps(reply).encode()

    return edit


def _short(path: str):
    """An edit of a valid reply: the list at a dotted ``path`` loses its last item."""

    def edit(reply: dict) -> bytes:
        node, key = _parent(reply, _keys(path))
        node[key] = node[key][:-1]
        return json.dumps(reply).encode()

    return edit


WRONG_SHAPES = [
    ("completions", lambda r: b"[1, 2]", r"the reply should be a JSON object, got \[1, 2\]"),
    ("completions", lambda r: b"<html>Bad gateway</html>", r"not JSON: b'<html>Bad gateway</html>'"),
    ("completions", lambda r: b"\xff\xfe{", r"not JSON"),
    ("completions", lambda r: b"[" * 100_000, r"not JSON"),
    ("completions", _with("choices", _DROP), r"choices should be a non-empty list, got None"),
    ("completions", _with("choices", []), r"choices should be a non-empty list, got \[\]"),
    ("completions", _with("choices", {"0": {}}), r"choices should be a non-empty list"),
    ("completions", _with("choices.0", 1), r"choices\[0\] should be an object, got 1"),
    ("completions", _with("choices.0.text", 5), r"choices\[0\]\.text should be a string, got 5"),
    ("completions", _with("choices.0.text", _DROP), r"choices\[0\]\.text should be a string, got None"),
    ("completions", _with("choices.0.finish_reason", ["stop"]), r"choices\[0\]\.finish_reason should be a string or null"),
    ("completions", _with("choices.0.logprobs", "x"), r"choices\[0\]\.logprobs should be an object or null, got 'x'"),
    ("completions", _with("choices.0.logprobs.tokens", 5), r"logprobs\.tokens should be a list, got 5"),
    ("completions", _with("choices.0.logprobs.tokens.0", 7), r"logprobs\.tokens\[0\] should be a string, got 7"),
    ("completions", _with("choices.0.logprobs.token_logprobs.0", "x"), r"token_logprobs\[0\] should be a log-probability"),
    ("completions", _with("choices.0.logprobs.token_logprobs.0", 3.5), r"token_logprobs\[0\] should be a log-probability"),
    ("completions", _short("choices.0.logprobs.token_logprobs"), r"token_logprobs should be as long as tokens \(1\), got 0"),
    ("completions", _with("choices.0.logprobs.tokens.0", "token_id:abc"), r"tokens\[0\] should be 'token_id:N' with N in 0\.\.49151"),
    ("completions", _with("choices.0.logprobs.tokens.0", "token_id:99999999"), r"tokens\[0\] should be 'token_id:N' with N in"),
    ("completions", _with("usage", "lots"), r"usage should be an object or null, got 'lots'"),
    ("completions", _with("usage", {"prompt_tokens": -1}), r"usage\.prompt_tokens should be a count"),
    ("chat", _with("choices.0.message", _DROP), r"choices\[0\]\.message should be an object, got None"),
    ("chat", _with("choices.0.message", "hi"), r"choices\[0\]\.message should be an object, got 'hi'"),
    ("chat", _with("choices.0.message.content", 3), r"message\.content should be a string or null, got 3"),
    ("chat", _with("choices.0.logprobs.content", "x"), r"logprobs\.content should be a list or null, got 'x'"),
    ("chat", _with("choices.0.logprobs.content.0", 3), r"logprobs\.content\[0\] should be an object, got 3"),
    ("chat", _with("choices.0.logprobs.content.0.token", None), r"content\[0\]\.token should be a string"),
    ("chat", _with("choices.0.logprobs.content.0.logprob", "x"), r"content\[0\]\.logprob should be a log-probability"),
    ("chat", _with("choices.0.logprobs.content.0.bytes", [300]), r"content\[0\]\.bytes should be a list of byte values"),
]


@pytest.mark.parametrize("endpoint,edit,pattern", WRONG_SHAPES, ids=[f"{e}-{i}" for i, (e, _, _) in enumerate(WRONG_SHAPES)])
@pytest.mark.probe("fault")
def test_a_wrong_shape_reply_names_the_server_and_the_field(tokenizer, endpoint, edit, pattern):
    with StubOpenAIServer(tokenizer) as server:
        engine = _engine(server, tokenizer, endpoint=endpoint, require_logprobs=False)
        prompt = _prompt(tokenizer, "go")
        engine.generate([prompt], GREEDY)
        server.script.append(("body", edit(server.answer(f"/v1/{_PATHS[endpoint]}", server.requests[-1]))))
        with pytest.raises(RemoteEngineError) as info:
            engine.generate([prompt], GREEDY)
        message = str(info.value)
        assert type(info.value) is RemoteEngineError and "\n" not in message
        assert message.startswith(f"{server.url}/{_PATHS[endpoint]} ") and re.search(pattern, message), message
        assert len(server.requests) == 2  # a malformed reply is not retried


_PATHS = {"completions": "completions", "chat": "chat/completions"}
_JUNK = [None, 0, -1, 2.5, math.nan, True, "", "x", "token_id:", "token_id:-3", [], [None], {}, {"a": 1}, [1, "a"], 10**30]


def _paths(node, path=()):
    yield path
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield from _paths(child, (*path, key))


def _corrupt(rng: random.Random, reply: dict) -> bytes:
    """One seeded corruption of a valid reply: a field replaced by junk, dropped or wrapped, or the bytes cut or random."""
    kind = rng.choice(["junk", "junk", "junk", "drop", "wrap", "cut", "noise"])
    data = json.dumps(reply).encode()
    if kind == "cut":
        return data[: rng.randrange(len(data))]
    if kind == "noise":
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
    tree = copy.deepcopy(reply)
    node, key = _parent(tree, rng.choice(list(_paths(tree))[1:]))
    if kind == "drop":
        del node[key]
    else:
        node[key] = [node[key]] if kind == "wrap" else rng.choice(_JUNK)
    return json.dumps(tree).encode()


@pytest.mark.parametrize("endpoint,vllm_extensions", [("completions", True), ("completions", False), ("chat", True), ("chat", False)])
@pytest.mark.probe("fault")
def test_fuzzed_replies_raise_only_remote_engine_error(tokenizer, endpoint, vllm_extensions):
    rng = random.Random(f"{endpoint}-{vllm_extensions}")
    outcomes = {"ok": 0, "error": 0}
    with StubOpenAIServer(tokenizer, reply=lambda p: "Left and then Down") as server:
        engines = [_engine(server, tokenizer, endpoint=endpoint, vllm_extensions=vllm_extensions, max_retries=0,
                           require_logprobs=require) for require in (True, False)]
        prompt = _prompt(tokenizer, "go")
        engines[0].generate([prompt], GREEDY)
        valid = server.answer(f"/v1/{_PATHS[endpoint]}", server.requests[-1])
        for case in range(150):
            body = _corrupt(rng, valid)
            server.script.append(("body", body))
            try:
                out = engines[case % 2].generate([prompt], GREEDY)[0]
            except RemoteEngineError as e:
                assert "\n" not in str(e) and str(e).startswith(server.url), str(e)
                outcomes["error"] += 1
            except Exception as e:  # anything else is the defect this test looks for
                pytest.fail(f"case {case}: {type(e).__name__}: {e} for the reply {body[:300]!r}")
            else:
                assert all(type(t) is int for t in out.token_ids) and len(out.logprobs) == len(out.token_ids)
                assert all(type(x) is float for x in out.logprobs)
                outcomes["ok"] += 1
    assert outcomes["error"] >= 75, outcomes  # the corruptions bite


@pytest.mark.probe("fault")
def test_unreachable_server_is_retried_then_named(tokenizer):
    engine = OpenAICompatEngine("http://127.0.0.1:9", "m", tokenizer, max_retries=1, backoff=0.01, timeout=1.0)
    with pytest.raises(RemoteEngineError, match=r"failed after 2 attempts in \d+\.\d s \(last: ConnectionRefusedError.*"
                                                r"Check that the server is up.*raise timeout= \(now 1s\) / max_retries= \(now 1\)"):
        engine.generate([[1, 2, 3]], GREEDY)


def test_missing_logprobs_is_an_error_unless_evaluation_only(tokenizer):
    with StubOpenAIServer(tokenizer, reply=lambda p: "Down") as server:
        server.script.append("no_logprobs")
        with pytest.raises(NoLogprobsError, match="returned no per-token logprobs.*require_logprobs=False"):
            _engine(server, tokenizer).generate([_prompt(tokenizer, "go")], GREEDY)
        assert len(server.requests) == 1  # a 200 without logprobs is not retried
        server.script.append("no_logprobs")
        out = _engine(server, tokenizer, require_logprobs=False).generate([_prompt(tokenizer, "go")], GREEDY)[0]
        assert out.token_ids == _ids(tokenizer, "Down") and out.stats["ids"] == "retokenized"
        assert all(math.isnan(x) for x in out.logprobs) and len(out.logprobs) == len(out.token_ids)


def test_client_errors_are_not_retried_and_name_the_fix(tokenizer):
    with StubOpenAIServer(tokenizer) as server:
        server.api_key = "right-key"
        with pytest.raises(RemoteEngineError, match="rejected the API key.*OPENAI_API_KEY"):
            _engine(server, tokenizer, api_key="wrong-key").generate([_prompt(tokenizer, "go")], GREEDY)
        assert len(server.requests) == 1
        engine = OpenAICompatEngine(server.url, "no-such-model", tokenizer, api_key="right-key", backoff=0.01)
        with pytest.raises(RemoteEngineError, match="HTTP 404 for model 'no-such-model'.*serves: stub-model"):
            engine.generate([_prompt(tokenizer, "go")], GREEDY)
        assert len(server.requests) == 2
        server.script.append(400)
        with pytest.raises(RemoteEngineError, match=r"HTTP 400: scripted HTTP 400\); it is not retried"):
            _engine(server, tokenizer, api_key="right-key").generate([_prompt(tokenizer, "go")], GREEDY)
        assert len(server.requests) == 3


def test_batch_runs_concurrently_and_keeps_input_order(tokenizer):
    words = ["Left", "Down", "Right", "Up", "Left Left", "Down Down"]
    with StubOpenAIServer(tokenizer, reply=lambda p: "say " + _last_user(p)) as server:
        # earlier prompts answer later, so completion order is the reverse of input order
        server.delay = lambda body: 0.05 * (len(words) - words.index(_last_user(tokenizer.decode(body["prompt"]))))
        engine = _engine(server, tokenizer, concurrency=len(words))
        t0 = time.perf_counter()
        outs = engine.generate([_prompt(tokenizer, w) for w in words], GREEDY)
        wall = time.perf_counter() - t0
        assert [tokenizer.decode(o.token_ids) for o in outs] == ["say " + w for w in words]
        assert wall < 0.05 * sum(range(1, len(words) + 1))  # overlapped, not one after another


def test_remote_weights_cannot_be_synced(tokenizer):
    engine = OpenAICompatEngine("http://127.0.0.1:9/v1", "m", tokenizer)
    with pytest.raises(NotTrainableError, match="cannot update them.*HFEngine"):
        engine.sync_weights()
    assert engine.version == 0 and engine.trainable is False
    state = engine.state_dict()
    a = [engine.rng.random() for _ in range(3)]
    engine.load_state_dict(state)
    assert [engine.rng.random() for _ in range(3)] == a


def _frozenlake_oracle(prompt_text):
    """Shortest safe path's first move, read from the grid in the last user message."""
    grid = _last_user(prompt_text).split("\n")[:-1]
    cells = {(r, c): ch for r, row in enumerate(grid) for c, ch in enumerate(row)}
    start = next(pos for pos, ch in cells.items() if ch == "P")
    moves = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
    frontier, first = [start], {start: None}
    while frontier:
        nxt = []
        for pos in frontier:
            if cells[pos] == "G":
                return first[pos]
            for name, (dr, dc) in moves.items():
                q = (pos[0] + dr, pos[1] + dc)
                if cells.get(q, "H") != "H" and q not in first:
                    first[q] = first[pos] or name
                    nxt.append(q)
        frontier = nxt
    return "Left"


def test_collector_runs_frozenlake_episodes_through_the_server(tokenizer):
    with StubOpenAIServer(tokenizer, reply=_frozenlake_oracle) as server:
        engine = _engine(server, tokenizer, concurrency=4)
        col = Collector(engine, tokenizer, lambda: make("frozenlake-v0", max_turns=12), ContextSpec())
        groups = col.collect([3, 4, 5], group_size=2, sampling=SamplingParams(max_new_tokens=6, temperature=1.0), env_id="frozenlake-v0")
        trajs = [t for g in groups for t in g.trajectories]
        assert len(trajs) == 6 and all(t.success and t.termination == Termination.TERMINATED for t in trajs)
        for t in trajs:
            for turn in t.turns:
                assert turn.response_ids == _ids(tokenizer, turn.response_text) and turn.valid
                assert turn.logprobs == pytest.approx([-0.01 * (j + 1) for j in range(len(turn.response_ids))])
        sent = {tuple(r["prompt"]) for r in server.requests}
        assert all(tuple(turn.prompt_ids) in sent for t in trajs for turn in t.turns)  # the server saw the exact ids


def test_turnrl_eval_scores_a_served_model(tokenizer, capsys):
    from turnrl.cli import main

    with StubOpenAIServer(tokenizer, reply=_frozenlake_oracle) as server:
        code = main(["eval", "--engine", "openai", "--base-url", server.url, "--api-model", server.model,
                     "eval.num_tasks=4", "env.max_turns=12"])
        assert code == 0
        assert "frozenlake-v0: success 1.000" in capsys.readouterr().out
        assert len(server.requests) >= 4 and all(r["temperature"] == 0.0 for r in server.requests)  # greedy evaluation
        assert main(["eval", "--engine", "openai", "--base-url", server.url, "--api-model", "gpt-x", "eval.num_tasks=1"]) == 2
        assert "HTTP 404 for model 'gpt-x'" in capsys.readouterr().err
    assert main(["eval", "--engine", "openai", "--base-url", "http://127.0.0.1:9/v1"]) == 2
    assert "--engine openai needs --base-url" in capsys.readouterr().err
