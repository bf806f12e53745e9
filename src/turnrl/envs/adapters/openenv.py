"""OpenEnv in both directions: serve a turnrl env as an OpenEnv server, and drive an OpenEnv server as a turnrl env.

The protocol, as ``openenv-core`` 0.3 implements it (``openenv/core/env_server/http_server.py`` and
``openenv/core/env_client.py``):

- ``/ws`` (WebSocket) is the multi-step path: each connection is one session with its own env instance.
  The client sends JSON messages ``{"type": "reset", "data": {"seed": 3, ...}}``, ``{"type": "step",
  "data": <the action's fields>}``, ``{"type": "state"}`` and ``{"type": "close"}``; the server answers
  ``{"type": "observation", "data": {"observation": {<fields except reward/done/metadata>}, "reward":
  float | None, "done": bool}}``, ``{"type": "state", "data": {...}}`` or ``{"type": "error", "data":
  {"message": ..., "code": ...}}``.
- ``POST /reset`` and ``POST /step`` are stateless (each request builds, uses and closes a fresh env), so
  they cannot carry an episode past its first step; ``GET /health``, ``/schema``, ``/metadata`` describe
  the server.

**Serving** (:func:`create_app`, :class:`OpenEnvServer`, ``python -m turnrl.envs.adapters.openenv ENV_ID``):
every session builds ``turnrl.envs.make(env_id, **kwargs)`` (wrappers included, so the turn limit is
applied on the server). The action is ``{"text": str}``; the observation has ``text``, ``terminated``,
``truncated``, ``info`` (the turnrl info dict, JSON-encoded: ``actions``, ``valid``, ``success``,
``reward_components``, ...) and ``anchor``, with OpenEnv's ``reward`` and ``done = terminated or truncated``.
The session's ``state`` adds ``env_id``, ``instructions``, ``max_actions_per_turn``, ``examples`` and the
oracle's ``solution`` (None where the env has no oracle, with ``has_oracle`` False).

**Driving** (:class:`OpenEnvRemote`, registered as ``openenv-v0``): one WebSocket session per env through
OpenEnv's own ``GenericEnvClient``, run on one background event loop shared by all remote envs, so
``areset``/``astep`` are real coroutines that never block the caller's loop (``reset``/``step`` wait for
the same calls). Against a turnrl server the remote env reproduces the served env exactly (observations,
rewards, flags, info keys, anchors, task keys, instructions, examples, oracle). Against any other OpenEnv server
it maps the protocol as documented on :class:`OpenEnvRemote`.

Faults (:mod:`~turnrl.envs.adapters.openenv_client`). A server that cannot be reached raises
:class:`OpenEnvUnreachable` (a ``ConnectionError`` naming the URL and how to start a server). Every reply is checked against the protocol's shape (an ``observation`` object, a
finite or null ``reward``, a boolean ``done``, and the types of turnrl's own fields): a malformed one raises
:class:`OpenEnvProtocolError` naming the field, so the collector ends that episode as an env error instead of
training on it. An action the server's typed ``Action`` model rejects (``VALIDATION_ERROR``, e.g. ``"eight"``
for an ``int`` field) is model text, not a fault: an invalid turn whose observation gives the server's reasons.
Other server errors raise :class:`OpenEnvServerError` with the server's message and code.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import socket
import threading
import time
from typing import Any

from turnrl.envs.adapters import openenv_client, require
from turnrl.envs.adapters.openenv_client import (
    TURNRL_INFO, OpenEnvProtocolError, OpenEnvServerError, OpenEnvUnreachable, Rejected,
)
from turnrl.envs.base import Env

__all__ = [
    "OpenEnvProtocolError", "OpenEnvRemote", "OpenEnvServer", "OpenEnvServerError", "OpenEnvUnreachable", "create_app", "main",
]


def _jsonable(value: Any) -> Any:
    """``value`` as JSON-compatible data: tuples as lists, non-finite floats and unknown objects as strings."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "tolist"):
        return _jsonable(value.tolist())
    return repr(value)


# ----------------------------------------------------------------------------------------------- serving


@functools.cache
def _server_classes() -> tuple[type, type, type, type]:
    """The OpenEnv Action/Observation/State models and Environment class (built on first use: openenv is optional)."""
    require("openenv.core", "openenv-core")
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
    from pydantic import Field

    class TextAction(Action):
        """The model's response text, given to the turnrl env's ``step``."""

        text: str = Field(description="the model's response text")

    class TextObservation(Observation):
        """One turnrl ``reset``/``step`` result (OpenEnv adds ``reward`` and ``done``)."""

        text: str = Field(default="", description="the observation text")
        terminated: bool = Field(default=False, description="the task reached a terminal state")
        truncated: bool = Field(default=False, description="a limit (e.g. the turn limit) stopped the episode")
        info: dict[str, Any] = Field(default_factory=dict, description="turnrl's info dict (actions, valid, success, reward_components, ...)")
        anchor: str | None = Field(default=None, description="key of the current state (None if the env has none)")
        task_key: str | None = Field(default=None, description="what makes two tasks the same (Env.task_key()), on reset")

    class TurnrlState(State):
        """The session's env: what a client needs beyond observations."""

        env_id: str = ""
        instructions: str = ""
        max_actions_per_turn: int = 1
        examples: list[list[str]] = Field(default_factory=list)
        has_oracle: bool = False
        solution: list[str] | None = None

    class TurnrlEnvironment(Environment):
        """``turnrl.envs.make(env_id, **make_kwargs)`` behind OpenEnv's ``Environment`` interface."""

        SUPPORTS_CONCURRENT_SESSIONS = True  # every session builds its own env

        def __init__(self, env_id: str, make_kwargs: dict[str, Any]) -> None:
            from turnrl.envs import make

            super().__init__()
            self.env_id = env_id
            self.env = make(env_id, **make_kwargs)
            self._episode_id: str | None = None
            self._steps = 0

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TextObservation:
            text, info = self.env.reset(seed=seed, options=kwargs.get("options"))
            self._episode_id, self._steps = episode_id, 0
            return TextObservation(text=text, info=_jsonable(info), anchor=self._anchor(), task_key=self.env.task_key())

        def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
            text, reward, terminated, truncated, info = self.env.step(action.text)
            self._steps += 1
            return TextObservation(
                text=text, reward=float(reward), done=terminated or truncated, terminated=terminated,
                truncated=truncated, info=_jsonable(info), anchor=self._anchor(),
            )

        @property
        def state(self) -> TurnrlState:
            try:
                solution, has_oracle = self.env.solve(), True
            except NotImplementedError:
                solution, has_oracle = None, False
            return TurnrlState(
                episode_id=self._episode_id, step_count=self._steps, env_id=self.env_id,
                instructions=self.env.instructions, max_actions_per_turn=self.env.max_actions_per_turn,
                examples=[list(pair) for pair in self.env.examples()], has_oracle=has_oracle, solution=solution,
            )

        def get_metadata(self) -> Any:
            from turnrl.envs import registered

            return EnvironmentMetadata(name=self.env_id, description=registered().get(self.env_id, ""), version="turnrl")

        def _anchor(self) -> str | None:
            try:
                return self.env.anchor()
            except NotImplementedError:
                return None

        def close(self) -> None:
            self.env.close()

    return TextAction, TextObservation, TurnrlState, TurnrlEnvironment


def create_app(env_id: str, *, max_sessions: int = 64, **make_kwargs: Any) -> Any:
    """A FastAPI app serving ``make(env_id, **make_kwargs)`` with OpenEnv's routes (``/ws``, ``/reset``, ...).

    Up to ``max_sessions`` WebSocket sessions run at once, each with its own env. Unknown ids and keywords
    fail here (one env is built to check them), not on the first connection.
    """
    from turnrl.envs import make

    make(env_id, **make_kwargs).close()  # fail now, with turnrl's message, on a bad id or keyword
    from openenv.core.env_server.http_server import create_fastapi_app

    action_cls, observation_cls, _, environment_cls = _server_classes()
    factory = functools.partial(environment_cls, env_id, dict(make_kwargs))
    return create_fastapi_app(factory, action_cls, observation_cls, max_concurrent_envs=max_sessions)


class OpenEnvServer:
    """Serve a turnrl env over OpenEnv's protocol with uvicorn in a background thread.

    ``port=0`` picks a free port; :attr:`url` is the address to connect to. Use it as a context manager,
    or call :meth:`start` and :meth:`stop`.

        with OpenEnvServer("frozenlake-v0", max_turns=8) as server:
            env = make("openenv-v0", url=server.url)
    """

    def __init__(self, env_id: str, host: str = "127.0.0.1", port: int = 0, max_sessions: int = 64, **make_kwargs: Any) -> None:
        self.app = create_app(env_id, max_sessions=max_sessions, **make_kwargs)
        self.host, self.port = host, port
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @classmethod
    def for_app(cls, app: Any, host: str = "127.0.0.1", port: int = 0) -> "OpenEnvServer":
        """Run any ASGI app (e.g. one from OpenEnv's own ``create_fastapi_app``) the same way."""
        server = cls.__new__(cls)
        server.app, server.host, server.port = app, host, port
        server._server, server._thread = None, None
        return server

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> "OpenEnvServer":
        uvicorn = require("uvicorn", "uvicorn")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, name="openenv-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the OpenEnv server on {self.url} did not start within {timeout_s} s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> "OpenEnvServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ----------------------------------------------------------------------------------------------- driving


class _BackgroundLoop:
    """One event loop in a daemon thread, shared by every :class:`OpenEnvRemote` (a WebSocket lives on one loop)."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None or not cls._loop.is_running():
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                threading.Thread(target=run, name="turnrl-openenv-client", daemon=True).start()
                ready.wait()
                cls._loop = loop
            return cls._loop


class OpenEnvRemote(Env):
    """An OpenEnv server (by URL) as a turnrl env: one WebSocket session, driven with OpenEnv's ``GenericEnvClient``.

    How a server's messages become the turnrl contract (a turnrl server provides every field itself):

    - action: ``{action_field: response text}``; text the server's typed action rejects is an invalid turn
      (its observation: the server's reasons, then the previous observation);
    - observation text: the observation's ``observation_field`` if given, else its ``text`` field, else its
      only string field, else the whole observation as sorted JSON;
    - ``terminated``/``truncated``: the observation's fields of those names, else ``done`` / False;
    - reward: OpenEnv's ``reward`` (None is 0.0);
    - info: the observation's ``info`` dict where it has turnrl's keys; otherwise ``actions`` = [the text],
      ``valid`` = True, ``success`` = done and reward > 0, ``reward_components`` = ``{"outcome": reward}``;
    - ``anchor()``: the observation's ``anchor``, else the observation text;
    - ``task_key()``: the reset observation's ``task_key``, else the reset observation text;
    - instructions, examples, ``max_actions_per_turn`` and ``solve()``: from the session's ``state`` when
      the server is turnrl's (fetched once, lazily); otherwise ``instructions`` (give it for other
      servers), no examples, 1, and ``NotImplementedError``.

    Replies are validated (see the module docstring). The remote env's own ``TurnLimit`` (``max_turns`` of
    ``make``) applies on top of the server's.

    Args:
        url: the server's base URL (``http://host:port``; ``ws://`` works too).
        action_field: the action field that receives the response text.
        observation_field: the observation field shown as text (default: see above).
        instructions: the system prompt; default: the server's (turnrl servers) or "".
        connect_timeout_s, message_timeout_s: OpenEnv client timeouts.
    """

    def __init__(
        self,
        url: str | None = None,
        action_field: str = "text",
        observation_field: str | None = None,
        instructions: str | None = None,
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 60.0,
    ) -> None:
        if not url:
            raise ValueError("OpenEnvRemote needs the server's url, e.g. make('openenv-v0', url='http://127.0.0.1:8000')")
        client_class = openenv_client.client_class()
        self.url, self.action_field, self.observation_field = url, action_field, observation_field
        self._client = client_class(url, connect_timeout_s=connect_timeout_s, message_timeout_s=message_timeout_s)
        self._instructions = instructions
        self._state: dict[str, Any] | None = None
        self._text = ""
        self._anchor = ""
        self._task_key = ""
        self._closed = False

    # -- calls into the background loop

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, _BackgroundLoop.get()).result()

    async def _arun(self, coro: Any) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, _BackgroundLoop.get()))

    # -- the contract

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        return self._on_reset(self._run(self._client.reset(**_reset_data(seed, options))))

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        return self._on_reset(await self._arun(self._client.reset(**_reset_data(seed, options))))

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return self._on_step(self._run(self._client.step({self.action_field: action_text})), action_text)

    async def astep(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return self._on_step(await self._arun(self._client.step({self.action_field: action_text})), action_text)

    def anchor(self) -> str:
        return self._anchor

    def task_key(self) -> str:
        return self._task_key

    @property
    def instructions(self) -> str:  # type: ignore[override]
        if self._instructions is None:
            self._instructions = str(self._server_state().get("instructions", ""))
        return self._instructions

    @property
    def max_actions_per_turn(self) -> int:  # type: ignore[override]
        return int(self._server_state().get("max_actions_per_turn", 1))

    def examples(self) -> list[tuple[str, str]]:
        return [(str(obs), str(response)) for obs, response in self._server_state().get("examples", [])]

    def solve(self) -> list[str] | None:
        """The server's oracle for the current state (one ``state`` round trip); ``NotImplementedError`` without one."""
        state = self._run(self._client.state())
        if not state.get("has_oracle"):
            raise NotImplementedError(f"the OpenEnv server at {self.url} exposes no oracle")
        return state.get("solution")

    def render(self) -> str:
        return self._text

    def close(self) -> None:
        """End the session: send ``close`` and wait (up to 2 s) for the server to close the socket, then disconnect.

        ``GenericEnvClient.close`` closes its end right after sending ``close``, and OpenEnv's server then logs
        a ``WebSocketDisconnect`` when it closes its own end; waiting for the server avoids that race.
        """
        if not self._closed:
            self._closed = True
            self._run(_close_session(self._client))

    # -- mapping

    def _server_state(self) -> dict[str, Any]:
        if self._state is None:
            self._state = dict(self._run(self._client.state()))
        return self._state

    def _observation_text(self, observation: dict[str, Any]) -> str:
        if self.observation_field is not None:
            if self.observation_field not in observation:
                raise OpenEnvProtocolError(
                    f"the OpenEnv server at {self.url} sent an observation without the field {self.observation_field!r} "
                    f"(it has {sorted(observation)}); set observation_field= to one of those"
                )
            return str(observation[self.observation_field])
        if isinstance(observation.get("text"), str):
            return observation["text"]
        strings = [v for v in observation.values() if isinstance(v, str)]
        return strings[0] if len(strings) == 1 else json.dumps(observation, sort_keys=True, default=repr)

    def _on_reset(self, result: Any) -> tuple[str, dict[str, Any]]:
        observation = dict(result.observation)
        self._text = self._observation_text(observation)
        self._anchor = observation.get("anchor") or self._text
        self._task_key = observation.get("task_key") or self._text
        info = observation.get("info")
        return self._text, dict(info) if isinstance(info, dict) else {}

    def _on_step(self, result: Any, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if isinstance(result, Rejected):
            info = {"actions": [], "valid": False, "success": False, "reward_components": {"outcome": 0.0}}
            return f"{result.feedback()}\n\n{self._text}", 0.0, False, False, info
        observation = dict(result.observation)
        text = self._observation_text(observation)
        reward = float(result.reward) if result.reward is not None else 0.0
        done = bool(result.done)
        terminated = observation.get("terminated", done)
        truncated = observation.get("truncated", False)
        info = observation.get("info")
        if not (isinstance(info, dict) and TURNRL_INFO.keys() <= info.keys()):
            info = {
                "actions": [action_text], "valid": True, "success": done and reward > 0,
                "reward_components": {"outcome": reward},
            }
        self._text = text
        self._anchor = observation.get("anchor") or text
        return text, reward, terminated, truncated, dict(info)


async def _close_session(client: Any) -> None:
    ws = getattr(client, "_ws", None)  # GenericEnvClient's connection (None if it never connected)
    if ws is not None:
        try:
            await ws.send(json.dumps({"type": "close"}))
            await asyncio.wait_for(ws.wait_closed(), timeout=2.0)
        except Exception:  # the server is gone or slow: disconnect below regardless
            pass
    await client.close()


def _reset_data(seed: int | None, options: dict[str, Any] | None) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if seed is not None:
        data["seed"] = seed
    if options:
        data["options"] = options
    return data


def main(argv: list[str] | None = None) -> int:
    """``python -m turnrl.envs.adapters.openenv ENV_ID [key=value ...] [--host H] [--port P]``: serve until Ctrl-C."""
    import argparse

    import yaml

    parser = argparse.ArgumentParser(prog="python -m turnrl.envs.adapters.openenv", description=main.__doc__)
    parser.add_argument("env", help="a registered turnrl env id, e.g. frozenlake-v0")
    parser.add_argument("kwargs", nargs="*", help="make() keywords as key=value, e.g. max_turns=12")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-sessions", type=int, default=64)
    args = parser.parse_args(argv)
    kwargs = {}
    for item in args.kwargs:
        if "=" not in item:
            parser.error(f"env argument '{item}' is not key=value (example: max_turns=12)")
        key, value = item.split("=", 1)
        kwargs[key] = yaml.safe_load(value)
    from turnrl.envs import UnknownEnvError

    uvicorn = require("uvicorn", "uvicorn")
    try:
        app = create_app(args.env, max_sessions=args.max_sessions, **kwargs)
    except (UnknownEnvError, TypeError, ValueError, ImportError) as e:
        parser.error(str(e))
    uvicorn.run(app, host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
