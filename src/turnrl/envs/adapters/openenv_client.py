"""OpenEnv's ``GenericEnvClient`` with typed faults, for :class:`~turnrl.envs.adapters.openenv.OpenEnvRemote`.

- a server that cannot be reached: :class:`OpenEnvUnreachable` (a ``ConnectionError`` naming the URL and how
  to start a server);
- a reply without the protocol's shape (not JSON, no ``observation`` object, a ``reward`` that is not a
  finite number or null, a ``done`` that is not a bool, turnrl's own fields of the wrong type):
  :class:`OpenEnvProtocolError` naming the field;
- a step whose action the server's typed ``Action`` model rejects (``VALIDATION_ERROR``): not raised, the
  step returns a :class:`Rejected` with the server's reasons (model text is never an exception);
- any other ``{"type": "error"}`` reply: :class:`OpenEnvServerError` with the server's message and code.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from turnrl.envs.adapters import require


class OpenEnvUnreachable(ConnectionError):
    """No OpenEnv server answers at the URL; the message names the URL and how to start a server."""


class OpenEnvServerError(RuntimeError):
    """The server answered a message with OpenEnv's ``{"type": "error"}``.

    ``code`` is OpenEnv's ``WSErrorCode`` (``"EXECUTION_ERROR"``: the server's env raised, ...); ``errors`` are the
    validation errors the server listed with ``"VALIDATION_ERROR"`` (pydantic's ``loc``/``msg`` dicts).
    """

    def __init__(self, message: str, code: str, errors: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.code, self.errors = code, errors


class OpenEnvProtocolError(RuntimeError):
    """A server's reply does not have the shape of OpenEnv's protocol; the message names the field."""


TURNRL_INFO: dict[str, type] = {"actions": list, "valid": bool, "success": bool, "reward_components": dict}
_REPLY_SHAPE = 'OpenEnv observation replies are {"observation": {...}, "reward": number or null, "done": true or false}'


@dataclass(frozen=True)
class Rejected:
    """A step whose action the server's typed ``Action`` model rejected (``VALIDATION_ERROR``): nothing ran."""

    errors: list[dict[str, Any]]

    def feedback(self) -> str:
        reasons = "; ".join(
            f"{'.'.join(str(part) for part in e.get('loc', ())) or 'action'}: {e.get('msg', '')}" for e in self.errors
        )
        return f"The server rejected the action ({reasons or 'no reason given'}). Answer in the form the task asks for."


@functools.cache
def client_class() -> type:
    """OpenEnv's ``GenericEnvClient`` with typed faults (see the module docstring); built on first use."""
    require("openenv.core", "openenv-core")
    from openenv.core.generic_client import GenericEnvClient

    class CheckedClient(GenericEnvClient):
        def __init__(self, base_url: str, **kwargs: Any) -> None:
            super().__init__(base_url=base_url, **kwargs)
            self.server_url = base_url
            self._message_type = ""

        async def connect(self) -> Any:
            try:
                return await super().connect()
            except ConnectionError as e:
                port, cause = urlsplit(self.server_url).port or "PORT", e.__cause__ or e
                raise OpenEnvUnreachable(
                    f"cannot reach the OpenEnv server at {self.server_url} ({type(cause).__name__}: {_one_line(cause)}). "
                    f"Start it first (a turnrl env: python -m turnrl.envs.adapters.openenv ENV_ID --port {port}) or set "
                    "url= to a running server"
                ) from e

        async def step(self, action: dict[str, Any], **kwargs: Any) -> Any:
            try:
                return await super().step(action, **kwargs)
            except OpenEnvServerError as e:
                if e.code != "VALIDATION_ERROR":
                    raise
                return Rejected(e.errors)

        async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
            self._message_type = str(message.get("type"))
            await self._send(message)
            try:
                response = await self._receive()
            except json.JSONDecodeError as e:
                raise self._malformed(f"it is not JSON ({e.msg})") from None
            if not isinstance(response, dict):
                raise self._malformed(f"it is a JSON {type(response).__name__}, not a JSON object")
            if response.get("type") == "error":
                data = response.get("data") if isinstance(response.get("data"), dict) else {}
                listed = data.get("errors") if isinstance(data.get("errors"), list) else []
                errors = [e for e in listed if isinstance(e, dict)]
                code = str(data.get("code", "UNKNOWN"))
                raise OpenEnvServerError(
                    f"the OpenEnv server at {self.server_url} failed on {self._message_type}: "
                    f"{_one_line(data.get('message', 'no message'))} (code: {code})", code, errors,
                )
            return response

        def _parse_result(self, payload: Any) -> Any:
            problem = _reply_problem(payload)
            if problem:
                raise self._malformed(problem)
            return super()._parse_result(payload)

        def _parse_state(self, payload: Any) -> dict[str, Any]:
            if not isinstance(payload, dict):
                raise self._malformed(f"its data is a {type(payload).__name__}, not an object")
            return payload

        def _malformed(self, problem: str) -> OpenEnvProtocolError:
            return OpenEnvProtocolError(
                f"the OpenEnv server at {self.server_url} sent a malformed reply to {self._message_type}: {problem}. "
                f"Fix the server: {_REPLY_SHAPE}"
            )

    return CheckedClient


def _reply_problem(payload: Any) -> str | None:
    """What is wrong with an observation reply's data (OpenEnv's fields, and turnrl's where present); None if nothing."""
    if not isinstance(payload, dict):
        return f"its data is a {type(payload).__name__}, not an object"
    for key in ("observation", "reward", "done"):
        if key not in payload:
            return f"it has no {key!r} (it has {sorted(payload)})"
    observation, reward, done = payload["observation"], payload["reward"], payload["done"]
    if not isinstance(observation, dict):
        return f"'observation' is a {type(observation).__name__}, not an object"
    if reward is not None and not (isinstance(reward, (int, float)) and not isinstance(reward, bool) and math.isfinite(reward)):
        return f"'reward' is {reward!r:.60}, not a finite number or null"
    if not isinstance(done, bool):
        return f"'done' is {done!r:.60}, not true or false"
    checks = [("terminated", bool), ("truncated", bool), ("anchor", (str, type(None))), ("task_key", (str, type(None)))]
    for key, types in checks:
        if key in observation and not isinstance(observation[key], types):
            return f"the observation field {key!r} is {observation[key]!r:.60}, a {type(observation[key]).__name__}"
    info = observation.get("info")
    if isinstance(info, dict) and TURNRL_INFO.keys() <= info.keys():
        for key, typ in TURNRL_INFO.items():
            if not isinstance(info[key], typ):
                return f"the observation's info has {key!r} = {info[key]!r:.60}, not a {typ.__name__}"
    return None


def _one_line(value: Any) -> str:
    return " ".join(str(value).split())
