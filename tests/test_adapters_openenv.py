"""OpenEnv adapter (turnrl.envs.adapters.openenv) both ways, on loopback, against the real openenv-core package."""

import asyncio
import json
import urllib.request

import pytest
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.generic_client import GenericEnvClient

from turnrl.envs import UnknownEnvError, check_env, make
from turnrl.envs.adapters.openenv import OpenEnvRemote, OpenEnvServer
from turnrl.envs.adapters.openenv import main as serve_main
from turnrl.envs.checker import GARBAGE


@pytest.fixture(scope="module")
def server():
    with OpenEnvServer("frozenlake-v0", max_sessions=16) as running:
        yield running


def _direct_trace(env, seed, actions):
    """What an env shows for ``seed`` and ``actions``: the observations, rewards, flags, core info keys and anchors."""
    trace = [env.reset(seed=seed)[0]]
    for text in actions:
        obs, reward, terminated, truncated, info = env.step(text)
        core = {k: info[k] for k in ("actions", "valid", "success", "reward_components")}
        trace.append((obs, reward, terminated, truncated, core, info.get("truncation"), env.anchor()))
        if terminated or truncated:
            break
    return trace


async def _async_trace(env, seed, actions):
    trace = [(await env.areset(seed=seed))[0]]
    for text in actions:
        obs, reward, terminated, truncated, info = await env.astep(text)
        core = {k: info[k] for k in ("actions", "valid", "success", "reward_components")}
        trace.append((obs, reward, terminated, truncated, core, info.get("truncation"), env.anchor()))
        if terminated or truncated:
            break
    return trace


def test_openenvs_own_client_drives_a_served_env(server):
    direct = make("frozenlake-v0")
    obs, _ = direct.reset(seed=3)
    plan = direct.solve()
    with GenericEnvClient(base_url=server.url).sync() as client:
        result = client.reset(seed=3)
        assert result.observation["text"] == obs and result.done is False
        state = client.state()
        assert state["env_id"] == "frozenlake-v0" and state["solution"] == plan
        assert state["instructions"] == direct.instructions and state["has_oracle"] is True
        for action in plan:  # a multi-step episode in one session
            expected = direct.step(action)
            result = client.step({"text": action})
            assert result.observation["text"] == expected[0] and result.reward == expected[1]
        assert result.done is True and result.observation["terminated"] is True
        assert result.observation["info"]["success"] is True and result.observation["info"]["episode"]["length"] == len(plan)
        assert client.state()["step_count"] == len(plan)
    with urllib.request.urlopen(f"{server.url}/health") as response:
        assert json.load(response)["status"] == "healthy"
    with urllib.request.urlopen(f"{server.url}/schema") as response:
        assert "text" in json.load(response)["action"]["properties"]


@pytest.mark.parametrize("seed", [0, 5, 17])
def test_round_trip_equals_the_direct_env(server, seed):
    direct = make("frozenlake-v0")
    direct.reset(seed=seed)
    plans = [direct.solve(), ["Up", "Left", GARBAGE, "Right", "Down", "Down", "Right", "Down"], [GARBAGE] * 9]
    remote = make("openenv-v0", url=server.url)
    try:
        for actions in plans:
            expected = _direct_trace(direct, seed, actions)
            assert _direct_trace(remote, seed, actions) == expected
            assert asyncio.run(_async_trace(remote, seed, actions)) == expected
        # the served env's TurnLimit (8 turns for frozenlake-v0) truncates the all-garbage episode
        assert expected[-1][3] is True and expected[-1][5] == "turns" and len(expected) == 9
        assert remote.instructions == direct.instructions and remote.examples() == direct.examples()
        assert remote.task_key() == direct.task_key() == "/".join(direct.unwrapped.desc)  # the served env's key
        remote.reset(seed=seed)
        direct.reset(seed=seed)
        assert remote.solve() == direct.solve()
    finally:
        remote.close()


def test_remote_env_passes_check_env_and_sessions_run_concurrently(server):
    check_env(OpenEnvRemote(server.url), seeds=(0, 1, 2), random_tasks=True)

    async def episode_pairs():
        remotes = [OpenEnvRemote(server.url) for _ in range(8)]
        try:
            first = await asyncio.gather(*(r.areset(seed=s) for s, r in enumerate(remotes)))
            second = await asyncio.gather(*(r.astep("Down") for r in remotes))
            return [(o, s[0], s[1]) for (o, _), s in zip(first, second)]
        finally:
            for r in remotes:
                r.close()

    direct = make("frozenlake-v0")
    expected = []
    for seed in range(8):
        obs, _ = direct.reset(seed=seed)
        step = direct.step("Down")
        expected.append((obs, step[0], step[1]))
    assert asyncio.run(episode_pairs()) == expected


@pytest.mark.probe("fault")
def test_server_errors_reach_the_client(server):
    remote = OpenEnvRemote(server.url)
    try:
        remote.reset(seed=0)
        for action in remote.solve():
            remote.step(action)
        with pytest.raises(RuntimeError, match="step\\(\\) after the episode terminated"):
            remote.step("Down")  # the served env raises; OpenEnv returns the error over the socket
    finally:
        remote.close()


class _CountAction(Action):
    message: str


class _CountObservation(Observation):
    echoed: str = ""


class _CountTo3(Environment):
    """A plain OpenEnv env (not turnrl's): count 'up' messages to 3."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.count = 0
        return _CountObservation(echoed="count 0")

    def step(self, action, timeout_s=None, **kwargs):
        self.count += action.message.strip().lower() == "up"
        done = self.count >= 3
        return _CountObservation(echoed=f"count {self.count}", reward=1.0 if done else 0.0, done=done)

    @property
    def state(self):
        return State(step_count=self.count)


def test_wraps_a_plain_openenv_server_by_url():
    app = create_fastapi_app(_CountTo3, _CountAction, _CountObservation)
    with OpenEnvServer.for_app(app) as plain:
        env = make("openenv-v0", url=plain.url, action_field="message", instructions="Say up.", max_turns=10)
        try:
            assert env.instructions == "Say up." and env.examples() == []
            assert env.reset(seed=1) == ("count 0", {})
            steps = [env.step(text) for text in ("up", "down", "up", "up")]
            assert [s[0] for s in steps] == ["count 1", "count 1", "count 2", "count 3"]
            obs, reward, terminated, truncated, info = steps[-1]
            assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
            assert info["reward_components"] == {"outcome": 1.0} and env.anchor() == "count 3"
            with pytest.raises(NotImplementedError, match="no oracle"):
                env.solve()
        finally:
            env.close()


@pytest.mark.probe("fault")
def test_configuration_errors_are_clear(capsys):
    with pytest.raises(UnknownEnvError, match="frozenlake-v0"):
        OpenEnvServer("frozenlak-v0")
    with pytest.raises(ValueError, match="needs the server's url"):
        make("openenv-v0")
    with pytest.raises(ConnectionError) as err:
        OpenEnvRemote("http://127.0.0.1:9", connect_timeout_s=2).reset(seed=0)  # nothing listens on port 9
    message = str(err.value)
    assert message.startswith("cannot reach the OpenEnv server at http://127.0.0.1:9 (ConnectionRefusedError") and "\n" not in message
    assert "python -m turnrl.envs.adapters.openenv ENV_ID --port 9" in message
    with pytest.raises(SystemExit):
        serve_main(["frozenlake-v0", "slipery=true"])
    assert "has no argument 'slipery'. Did you mean 'slippery'?" in capsys.readouterr().err


def test_collector_runs_a_remote_env_exactly_like_the_local_one(server, tokenizer):
    from turnrl.engines import HFEngine, SamplingParams
    from turnrl.models import tiny_model
    from turnrl.rollout import Collector

    model = tiny_model(tokenizer, seed=0)

    def collect(env_factory):
        engine = HFEngine(model, tokenizer, seed=0)  # same weights and sampling seed for both runs
        groups = Collector(engine, tokenizer, env_factory).collect(
            [3, 4], group_size=1, sampling=SamplingParams(max_new_tokens=4, temperature=1.0))
        return [
            (t.termination, t.success, [(u.prompt_ids, u.response_ids, u.observation, u.reward, u.valid, u.anchor)
                                        for u in t.turns])
            for g in groups for t in g.trajectories
        ]

    local = collect(lambda: make("frozenlake-v0", max_turns=2))
    remote = collect(lambda: make("openenv-v0", url=server.url, max_turns=2))
    assert remote == local and sum(len(turns) for _, _, turns in local) >= 2


class _GuessAction(Action):
    guess: int


class _GuessObservation(Observation):
    feedback: str = ""


class _GuessEight(Environment):
    """A plain OpenEnv env with a typed action: guess the number 8."""

    def reset(self, seed=None, episode_id=None, **kwargs):
        return _GuessObservation(feedback="Guess a number from 1 to 10.")

    def step(self, action, timeout_s=None, **kwargs):
        done = action.guess == 8
        return _GuessObservation(feedback="right" if done else "wrong", reward=float(done), done=done)

    @property
    def state(self):
        return State()


@pytest.fixture
def typed_server():
    with OpenEnvServer.for_app(create_fastapi_app(_GuessEight, _GuessAction, _GuessObservation)) as running:
        yield running


@pytest.mark.probe("bad_input")
def test_text_a_typed_action_rejects_is_an_invalid_turn_with_the_servers_reasons(typed_server):
    env = make("openenv-v0", url=typed_server.url, action_field="guess", instructions="Guess.", max_turns=10)
    try:
        first, _ = env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step("eight")
        assert (reward, terminated, truncated, info["valid"], info["actions"]) == (0.0, False, False, False, [])
        assert "rejected the action" in obs and "guess" in obs and "integer" in obs and obs.endswith(first)
        assert env.anchor() == first
        obs, reward, terminated, _, info = asyncio.run(env.astep("8"))
        assert (obs, reward, terminated, info["valid"], info["success"]) == ("right", 1.0, True, True, True)
    finally:
        env.close()


def _scripted_app(step_reply):
    """A WebSocket server speaking just enough of OpenEnv's protocol: a valid reset, then ``step_reply`` (raw text)."""
    from fastapi import FastAPI, WebSocket, WebSocketDisconnect

    app = FastAPI()
    reset = {"type": "observation", "data": {"observation": {"text": "start"}, "reward": None, "done": False}}

    @app.websocket("/ws")
    async def ws(websocket: WebSocket):
        await websocket.accept()
        try:
            while True:
                kind = json.loads(await websocket.receive_text())["type"]
                if kind == "close":
                    break
                await websocket.send_text(json.dumps(reset) if kind == "reset" else step_reply)
        except WebSocketDisconnect:
            pass
        await websocket.close()

    return app


def _observation(**data):
    return json.dumps({"type": "observation", "data": data})


@pytest.mark.parametrize("reply, needle", [
    (_observation(reward=1.0, done=True), "no 'observation'"),
    (_observation(observation="moved", reward=0.0, done=False), "'observation' is a str"),
    (_observation(observation={"text": "x"}, done=False), "no 'reward'"),
    (_observation(observation={"text": "x"}, reward="high", done=False), "'reward' is 'high'"),
    (_observation(observation={"text": "x"}, reward=float("nan"), done=False), "'reward' is nan"),
    (_observation(observation={"text": "x"}, reward=0.0), "no 'done'"),
    (_observation(observation={"text": "x"}, reward=0.0, done="no"), "'done' is 'no'"),
    (_observation(observation={"text": "x", "terminated": "yes"}, reward=0.0, done=False), "'terminated' is 'yes'"),
    (_observation(observation={"text": "x", "info": {"actions": "Down", "valid": True, "success": False,
                                                      "reward_components": {}}}, reward=0.0, done=False), "info"),
    (json.dumps({"type": "state", "data": {}}), "no 'observation'"),
    (json.dumps(["observation"]), "not a JSON object"),
    ("not json", "not JSON"),
])
@pytest.mark.probe("fault")
def test_a_wrong_shape_reply_is_an_env_error_naming_what_is_wrong(reply, needle):
    from turnrl.envs.adapters.openenv import OpenEnvProtocolError

    with OpenEnvServer.for_app(_scripted_app(reply)) as scripted:
        env = OpenEnvRemote(scripted.url, instructions="x", message_timeout_s=5)
        try:
            assert env.reset(seed=0) == ("start", {})
            with pytest.raises(OpenEnvProtocolError, match=needle) as err:
                env.step("Down")
            assert scripted.url in str(err.value) and "\n" not in str(err.value)
        finally:
            env.close()
