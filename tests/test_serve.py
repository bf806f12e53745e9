"""The rollout service (turnrl.engines.serve): exact ids over HTTP, sessions closed into trajectories, the collector's
``full`` layout, bad requests, and a training step on served episodes."""

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from turnrl.agent.chat import ChatRenderer
from turnrl.agent.context import ContextSpec
from turnrl.config import load_config
from turnrl.engines import HFEngine, OpenAICompatEngine, SamplingParams
from turnrl.engines.serve import EngineGate, RolloutServer
from turnrl.engines.sessions import Call, Outcome, SessionStore, UnknownSession
from turnrl.envs import Env, make, register, registered
from turnrl.rollout import Collector

GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)


class Relay(Env):
    """Three turns whatever the agent says; pays 1 at the end when the last response has an even length."""

    instructions = "Say something."

    def reset(self, *, seed=None, options=None):
        self.t, self.seed = 0, seed
        return f"task {seed}: start", {}

    def step(self, action_text):
        self.t += 1
        done = self.t >= 3
        r = float(done and len(action_text) % 2 == 0)
        return f"turn {self.t} of task {self.seed}", r, done, False, {"success": r > 0, "valid": True, "actions": [action_text]}


if "serve-relay-v0" not in registered():
    register("serve-relay-v0", Relay, description="test env")


@pytest.fixture
def engine(tiny_model, tokenizer):
    return HFEngine(tiny_model, tokenizer, autocast_bf16=False, seed=0)


@pytest.fixture
def server(engine, tokenizer, tmp_path):
    store = SessionStore(tokenizer, tmp_path / "served.jsonl", "serve-relay-v0", session_timeout_s=60)
    with RolloutServer(engine, tokenizer, store, model_name="tiny", defaults=GREEDY, max_context_tokens=2048,
                       request_timeout_s=10) as s:
        yield s


def post(url, body, headers=None):
    """``(status, decoded JSON)`` of a POST; ``body`` bytes are sent as they are."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def play(url, env, seed, session, task=None):
    """A plain agent loop over HTTP: the env's chat grows by each reply and observation; the reward closes it."""
    obs, _ = env.reset(seed=seed)
    messages = [{"role": "system", "content": env.instructions}, {"role": "user", "content": obs}]
    total, headers = 0.0, {"X-Turnrl-Session": session}
    while True:
        status, reply = post(f"{url}/chat/completions", {"model": "tiny", "messages": messages, "max_tokens": 8,
                                                         "temperature": 0.0, "logprobs": True}, headers)
        assert status == 200, reply
        text = reply["choices"][0]["message"]["content"]
        obs, r, terminated, truncated, info = env.step(text)
        total += r
        if terminated or truncated:
            break
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": obs}]
    body = {"reward": total, "success": bool(info.get("success")), **({"task": task} if task else {})}
    return post(f"{url}/sessions/{session}/reward", body)


def test_chat_completion_returns_the_engines_exact_ids_and_logprobs(server, engine, tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    status, reply = post(f"{server.url}/chat/completions", {"messages": messages, "logprobs": True, "temperature": 0.0},
                         {"X-Turnrl-Session": "a"})
    assert status == 200, reply
    prompt = ChatRenderer(tokenizer, "Be brief.").per_step_prompt("Hello there")
    assert reply["turnrl"]["prompt_ids"] == prompt
    ids = reply["turnrl"]["token_ids"]
    assert reply["choices"][0]["message"]["content"] == tokenizer.decode(ids, skip_special_tokens=True)
    direct = engine.generate([prompt], GREEDY)[0]
    assert ids == direct.token_ids and len(ids) > 0
    served = [e["logprob"] for e in reply["choices"][0]["logprobs"]["content"]]
    assert served == direct.logprobs
    assert reply["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                              "total_tokens": len(prompt) + len(ids)}


def test_completions_take_text_or_ids_and_the_projects_client_reads_exact_ids(server, engine, tokenizer):
    ids = tokenizer("The cat sat", add_special_tokens=False)["input_ids"]
    direct = engine.generate([ids], GREEDY)[0]
    for prompt in ("The cat sat", ids):
        status, reply = post(f"{server.url}/completions", {"prompt": prompt, "logprobs": 1, "temperature": 0})
        assert status == 200, reply
        assert reply["turnrl"]["prompt_ids"] == ids and reply["turnrl"]["token_ids"] == direct.token_ids
        assert reply["choices"][0]["logprobs"]["token_logprobs"] == direct.logprobs
    client = OpenAICompatEngine(server.url, "tiny", tokenizer)  # vLLM's token_id:N tokens: ids without a lookup
    remote = client.generate([ids], GREEDY)[0]
    assert remote.token_ids == direct.token_ids and remote.stats["ids"] == "server"
    assert remote.logprobs == direct.logprobs
    with urllib.request.urlopen(f"{server.url}/models", timeout=10) as r:
        assert [m["id"] for m in json.loads(r.read())["data"]] == ["tiny"]


def test_a_growing_session_is_the_trajectory_the_full_collector_records(server, engine, tokenizer, tmp_path):
    """Same env, seed and greedy engine: the agent over HTTP and the collector (``full``, no few-shot) record the
    same ids, logprobs and layout; the reward closes the session, which is written once and only once."""
    status, closed = play(server.url, make("serve-relay-v0"), seed=7, session="ep-1", task="relay-7")
    assert status == 200 and closed == {"session": "ep-1", "task": "relay-7", "turns": 3, "context": "full",
                                        "policy_version": 0}
    collector = Collector(engine, tokenizer, lambda: make("serve-relay-v0"), ContextSpec("full", few_shot=False))
    expected = collector.collect([7], 1, GREEDY)[0].trajectories[0]
    [served] = server.store.take(1, 1, timeout_s=1)[0]
    assert served.context == expected.context == "full"
    for mine, theirs in zip(served.turns, expected.turns, strict=True):
        assert (mine.prompt_ids, mine.response_ids, mine.response_text, mine.observation) == \
               (theirs.prompt_ids, theirs.response_ids, theirs.response_text, theirs.observation)
        assert mine.logprobs == theirs.logprobs
    assert served.total_reward == expected.total_reward and served.success == expected.success
    [row] = [json.loads(line) for line in (tmp_path / "served.jsonl").read_text().splitlines()]
    assert row["session"] == "ep-1" and row["context"] == "full" and row["task_key"] == "relay-7"
    assert [t["prompt_ids"] for t in row["turns"]] == [t.prompt_ids for t in expected.turns]
    assert [t["response_ids"] for t in row["turns"]] == [t.response_ids for t in expected.turns]
    status, again = post(f"{server.url}/sessions/ep-1/reward", {"reward": 1.0})
    assert status == 404 and "no open episode" in again["error"]["message"]


def test_an_idle_session_expires_and_a_wait_for_groups_times_out_saying_what_arrived(tokenizer):
    store = SessionStore(tokenizer, None, "serve-relay-v0", session_timeout_s=0.05)
    store.record("idle", Call([1, 2], [3], [-0.5], "x", "stop", 0, "obs"), None, "t")
    time.sleep(0.1)
    assert store.last("idle") is None and store.expired == 1
    with pytest.raises(UnknownSession):
        store.close("idle", Outcome(1.0))
    store.record("done", Call([1, 2], [3], [-0.5], "x", "stop", 0, "obs"), None, "t")
    store.close("done", Outcome(1.0))
    with pytest.raises(TimeoutError, match=r"2 closed episodes of each of 1 tasks; closed episodes by task: \{'t': 1\}"):
        store.take(1, 2, timeout_s=0.1)


def test_calls_that_do_not_extend_each_other_are_per_step_turns(server, tokenizer):
    headers = {"X-Turnrl-Session": "p", "X-Turnrl-Task": "q"}  # the task named on the calls, not in the reward
    prompts = []
    for question in ("first question", "second question"):
        messages = [{"role": "user", "content": question}]
        status, reply = post(f"{server.url}/chat/completions", {"messages": messages, "temperature": 0}, headers)
        assert status == 200
        prompts.append(reply["turnrl"]["prompt_ids"])
    status, closed = post(f"{server.url}/sessions/p/reward", {"reward": 0.5})
    assert status == 200 and closed["context"] == "per_step" and closed["turns"] == 2 and closed["task"] == "q"
    [traj] = server.store.take(1, 1, timeout_s=1)[0]
    assert [t.prompt_ids for t in traj.turns] == prompts  # each turn keeps its whole prompt
    assert [t.reward for t in traj.turns] == [0.0, 0.5]  # the outcome reward is paid on the last turn


def test_a_session_named_by_the_user_field_and_a_call_without_one(server):
    post(f"{server.url}/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "user": "u1"})
    post(f"{server.url}/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})  # not recorded
    assert server.store.last("u1") is not None and len(server.store.last("u1").calls) == 1


@pytest.mark.probe("bad_input")
@pytest.mark.parametrize("path, body, status, needle", [
    ("/chat/completions", b"{not json", 400, "not JSON"),
    ("/chat/completions", {"model": "tiny"}, 400, "messages should be a non-empty list"),
    ("/chat/completions", {"messages": [{"role": "user", "content": 3}]}, 400, "messages[0].content should be a string"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400, "temperature"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": True}, 400, "stream"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4000}, 400, "max_tokens"),
    ("/completions", {"prompt": [1, -5]}, 400, "prompt should be"),
    ("/sessions/nobody/reward", {"reward": 1.0}, 404, "no open episode"),
    ("/sessions/nobody/reward", {"reward": "high"}, 400, "reward should be a number"),
    ("/embeddings", {"input": "x"}, 404, "/v1/chat/completions"),
])
def test_bad_requests_get_a_json_error_naming_the_field(server, path, body, status, needle):
    got, reply = post(server.url + path, body)
    assert got == status and needle in reply["error"]["message"], reply


def test_a_closed_gate_answers_503_after_the_request_timeout(engine, tokenizer):
    store = SessionStore(tokenizer, None, "serve-relay-v0", session_timeout_s=60)
    with RolloutServer(engine, tokenizer, store, model_name="tiny", defaults=GREEDY, max_context_tokens=2048,
                       request_timeout_s=0.2, gate=EngineGate(is_open=False)) as s:
        status, reply = post(f"{s.url}/completions", {"prompt": "x"})
    assert status == 503 and "serve.request_timeout_s" in reply["error"]["message"]


def test_training_refuses_another_temperature_and_takes_a_step_on_served_episodes(tmp_path, tokenizer):
    from turnrl.build import build
    from turnrl.loop import train
    from turnrl.models import tiny_model
    from turnrl.monitor.sinks import read_metrics

    cfg = load_config(None, [
        "env.id=serve-relay-v0", "env.progress_reward=0", "serve.train=true", "serve.port=0",
        f"serve.record_file={tmp_path / 'served.jsonl'}", "serve.wait_timeout_s=120", "train.steps=1",
        "rollout.tasks_per_step=1", "rollout.group_size=2", "rollout.max_new_tokens=8", "eval.num_tasks=1",
        "eval.at_start=false", "log.progress=false", "log.tensorboard=false", "log.report=false", "train.lr=1e-3",
        "model.autocast_bf16=false", f"log.run_dir={tmp_path}", "log.name=served",
    ])
    c = build(cfg, model=tiny_model(tokenizer, seed=0), tokenizer=tokenizer)
    url = c.collector.server.url
    try:
        results = []
        agents = [threading.Thread(target=lambda i=i: results.append(
            _play_sampled(url, i, refused=i == 0))) for i in range(2)]
        for a in agents:
            a.start()
        run_dir = train(cfg, components=c)
        for a in agents:
            a.join(timeout=60)
    finally:
        c.collector.close()
    assert sorted(results) == [200, 200]
    [row] = [r for r in read_metrics(run_dir / "metrics.jsonl") if "rollout/collected_groups" in r]
    assert row["step"] == 1 and row["rollout/collected_groups"] == 1.0 and "eval/success_rate" in row
    assert c.engine.version == 1  # the update was synced to the engine that serves
    rows = [json.loads(line) for line in (tmp_path / "served.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and {r["task_key"] for r in rows} == {"relay-3"} and all(r["context"] == "full" for r in rows)


def _play_sampled(url, i, refused):
    """An agent sampling at the run's temperature (1.0): the trainer refuses greedy first, then plays task 3."""
    if refused:
        status, reply = post(f"{url}/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": 0})
        assert status == 400 and "rollout.temperature=1.0" in reply["error"]["message"]
    env = make("serve-relay-v0")
    obs, _ = env.reset(seed=3)
    messages = [{"role": "system", "content": env.instructions}, {"role": "user", "content": obs}]
    while True:
        status, reply = post(f"{url}/chat/completions", {"messages": messages}, {"X-Turnrl-Session": f"s{i}"})
        text = reply["choices"][0]["message"]["content"]
        obs, r, terminated, _, _ = env.step(text)
        if terminated:
            return post(f"{url}/sessions/s{i}/reward", {"reward": r, "task": "relay-3"})[0]
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": obs}]


def test_the_openai_sdk_agent_of_docs_serve_md_plays_through_the_server(server, tmp_path):
    """docs/serve.md's agent.py, as pasted, run against the server (one task, a group of two)."""
    from tests.test_docs import DOCS, python_blocks

    [(line, code)] = [(n, c) for n, c in python_blocks(DOCS / "serve.md") if "from openai import OpenAI" in c]
    env = {**os.environ, "TURNRL_URL": server.url, "TASKS": "1", "GROUP": "2"}
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"docs/serve.md:{line} failed:\n{run.stderr[-3000:]}"
    rows = [json.loads(x) for x in (server.store.record_file).read_text().splitlines()]
    lake = make("frozenlake-v0")
    lake.reset(seed=0)
    assert len(rows) == 2 and {r["task_key"] for r in rows} == {lake.task_key()}
    assert all(r["context"] == "full" and r["seed"] == 0 for r in rows)


def test_the_served_collector_drops_held_out_tasks_and_times_out_naming_the_knob(server, capsys):
    from turnrl.rollout.served import ServedCollector

    for session, task in (("h", "held"), ("k", "kept")):
        server.store.record(session, Call([1, 2], [3, 4], [-0.1, -0.2], "x", "stop", 0, "obs"), None, task)
        server.store.close(session, Outcome(1.0))
    collector = ServedCollector(server, lambda key: key == "held", wait_timeout_s=0.2)
    [group] = collector.collect([0], 1, GREEDY, env_id="serve-relay-v0")
    assert [t.task_key for t in group.trajectories] == ["kept"] and group.env_id == "serve-relay-v0"
    assert "held-out task 'held'" in capsys.readouterr().err
    stats = collector.take_stats()
    assert (stats.prompt_tokens, stats.generated_tokens) == (2, 2)
    with pytest.raises(TimeoutError, match=r"serve.wait_timeout_s"):
        collector.collect([0], 1, GREEDY)


@pytest.mark.probe("bad_input")
def test_a_taken_port_is_a_one_line_config_error_naming_the_key(server, engine, tokenizer):
    from turnrl.build import rollout_server
    from turnrl.config import ConfigError

    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    cfg = load_config(None, [f"serve.port={port}", "serve.record_file="])
    with pytest.raises(ConfigError, match=rf"serve.port={port}: .*serve.port=0: any free port"):
        rollout_server(cfg, engine, tokenizer, EngineGate())
