"""``turnrl serve``: an OpenAI-compatible HTTP API in front of any engine, recording each episode as exact token ids.

Endpoints (non-streaming only; ``docs/serve.md`` has a worked example):

- ``POST /v1/chat/completions``: ``messages`` are rendered with the tokenizer's chat template to ids. When they are
  the session's previous messages, the assistant reply it was sent and one new user message, the prompt is the
  previous prompt + response ids + the template's glue and the new message (:meth:`ChatRenderer.full_continuation`),
  never a re-tokenization of the reply, so the session stays one exact conversation, as the collector's ``full``
  context builds it.
- ``POST /v1/completions``: ``prompt`` is a string (tokenized without special tokens) or a list of token ids.
- ``GET /v1/models``: the one model served.
- ``POST /v1/sessions/{id}/reward`` with ``{"reward": float, "success": bool, "truncated": bool, "task": str,
  "seed": int}`` (all but ``reward`` optional) closes the episode (:mod:`turnrl.engines.sessions`).

Sessions: the header ``X-Turnrl-Session`` (else the body's ``user`` field) names the episode a call belongs to; a call
without one is answered and not recorded. ``X-Turnrl-Task`` (or the reward's ``task``) names the task, so that a
training source groups episodes of one task. Sampling: ``max_tokens`` (or ``max_completion_tokens``),
``temperature``, ``top_p``, ``stop``, and vLLM's ``top_k``, ``stop_token_ids`` and ``return_tokens_as_token_ids``
(tokens read ``token_id:N``, which :class:`~turnrl.engines.OpenAICompatEngine` maps back to ids exactly). ``seed``
and ``top_logprobs`` are accepted and not honoured (the engine's own seed stream samples; only the sampled token's
logprob is returned). Every reply also carries ``turnrl``: the session, the policy version, the prompt and
response ids. Requests run one at a time through an :class:`EngineGate`, which a trainer closes while it updates
the weights. A bad request gets a 4xx JSON error (OpenAI's shape) naming the field and the fix.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from turnrl.agent.chat import ChatRenderer
from turnrl.engines.base import Completion, Engine, SamplingParams
from turnrl.engines.sessions import Call, Outcome, Session, SessionStore, UnknownSession

MAX_BODY_BYTES = 32 * 2**20
SESSION_HEADER, TASK_HEADER = "X-Turnrl-Session", "X-Turnrl-Task"
_REWARD_PATH = re.compile(r"^/v1/sessions/([^/]+)/reward$")
_ROLES = ("system", "user", "assistant", "tool")


class BadRequest(Exception):
    """A request the server refuses: ``status`` (4xx / 503), a message naming the problem and the fix, the field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status


def _require(ok: bool, field: str, expected: str, value: Any) -> None:
    if not ok:
        got = repr(value)
        raise BadRequest(f"{field} should be {expected}, got {got if len(got) <= 80 else got[:77] + '...'}", field)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


class EngineGate:
    """Who may use the engine: served requests, one at a time, while the gate is open; a trainer while it is closed.

    :meth:`close` waits for the request in flight, so no response mixes two weight versions.
    """

    def __init__(self, is_open: bool = True) -> None:
        self._open, self._busy = is_open, False
        self._changed = threading.Condition()

    def open(self) -> None:
        with self._changed:
            self._open = True
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._open = False
            self._changed.wait_for(lambda: not self._busy)

    @contextmanager
    def generating(self, timeout_s: float) -> Iterator[None]:
        """Hold the engine for one request; raises ``TimeoutError`` if it is not free within ``timeout_s``."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._open and not self._busy, timeout_s):
                raise TimeoutError
            self._busy = True
        try:
            yield
        finally:
            with self._changed:
                self._busy = False
                self._changed.notify_all()


def sampling_of(body: dict[str, Any], defaults: SamplingParams, fixed_temperature: float | None) -> SamplingParams:
    """The request's sampling parameters (``defaults`` where it gives none). With ``fixed_temperature`` (a trainer
    computes its ratios at that temperature), any other temperature is refused."""
    _require(body.get("n", 1) == 1, "n", "1 (one choice per request)", body.get("n"))
    _require(body.get("stream", False) is False, "stream", "false (turnrl serve answers non-streaming)", body.get("stream"))
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", defaults.max_new_tokens))
    _require(_is_int(max_tokens) and max_tokens >= 1, "max_tokens", "an integer >= 1", max_tokens)
    temperature = body.get("temperature", defaults.temperature if fixed_temperature is None else fixed_temperature)
    _require(_is_number(temperature) and temperature >= 0, "temperature", "a number >= 0", temperature)
    if fixed_temperature is not None and temperature != fixed_temperature:
        raise BadRequest(f"temperature={temperature} but the trainer's ratios are at rollout.temperature="
                         f"{fixed_temperature}: send that temperature or none", "temperature")
    top_p = body.get("top_p", defaults.top_p)
    _require(_is_number(top_p) and 0 < top_p <= 1, "top_p", "a number in (0, 1]", top_p)
    top_k = body.get("top_k", defaults.top_k)
    _require(_is_int(top_k) and top_k >= -1, "top_k", "an integer >= 0 (-1 or 0: off)", top_k)
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    _require(isinstance(stop, list) and all(isinstance(s, str) and s for s in stop), "stop",
             "a non-empty string or a list of them", body.get("stop"))
    stop_ids = body.get("stop_token_ids") or []
    _require(isinstance(stop_ids, list) and all(_is_int(t) for t in stop_ids), "stop_token_ids", "a list of token ids",
             stop_ids)
    return SamplingParams(max_new_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p),
                          top_k=max(0, top_k), stop_token_ids=tuple(stop_ids), stop_strings=tuple(stop))


def chat_messages(body: dict[str, Any]) -> list[dict[str, str]]:
    """The request's ``messages`` as ``{"role", "content"}`` dicts (other keys dropped), checked."""
    messages = body.get("messages")
    _require(isinstance(messages, list) and len(messages) > 0, "messages",
             "a non-empty list of {role, content} objects", messages)
    out = []
    for i, m in enumerate(messages):
        _require(isinstance(m, dict), f"messages[{i}]", "an object {role, content}", m)
        _require(m.get("role") in _ROLES, f"messages[{i}].role", f"one of {', '.join(_ROLES)}", m.get("role"))
        _require(isinstance(m.get("content"), str), f"messages[{i}].content", "a string", m.get("content"))
        out.append({"role": m["role"], "content": m["content"]})
    return out


class RolloutServer:
    """The OpenAI-compatible rollout service over ``engine`` (see the module docstring), on ``host:port`` (0: a free
    port; :attr:`url` says which). ``store`` records the sessions; ``gate`` orders the engine's users."""

    def __init__(self, engine: Engine, tokenizer, store: SessionStore, *, model_name: str, defaults: SamplingParams,
                 max_context_tokens: int, request_timeout_s: float, gate: EngineGate | None = None,
                 fixed_temperature: float | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.engine, self.tokenizer, self.store = engine, tokenizer, store
        self.model_name, self.defaults, self.fixed_temperature = model_name, defaults, fixed_temperature
        self.max_context_tokens, self.request_timeout_s = max_context_tokens, request_timeout_s
        self.gate = gate or EngineGate()
        self.renderer = ChatRenderer(tokenizer, "")  # only its template glue: the client sends the whole chat
        self._httpd = ThreadingHTTPServer((host, port), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="turnrl-serve", daemon=True)

    @property
    def url(self) -> str:
        """The API's base URL, ``http://HOST:PORT/v1``."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> "RolloutServer":
        """Serve in a background thread; returns self."""
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until :meth:`close` (or Ctrl-C)."""
        self._httpd.serve_forever()

    def close(self) -> None:
        """Stop serving and free the port."""
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> "RolloutServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- requests -------------------------------------------------------------------------------------
    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "turnrl"}]}

    def chat(self, body: dict[str, Any], session: str | None, task: str | None) -> dict[str, Any]:
        messages = chat_messages(body)
        _require(messages[-1]["role"] in ("user", "tool", "system"), "messages[-1].role",
                 "user, tool or system (the model answers the last message)", messages[-1]["role"])
        previous = self.store.last(session) if session else None
        prompt = self._chat_prompt(messages, previous)
        call, comp = self._complete(body, prompt, messages[-1]["content"])
        if session:
            self.store.record(session, call, messages, task)
        logprobs = None
        if body.get("logprobs"):
            pieces = self._pieces(comp.token_ids)
            logprobs = {"content": [{"token": t, "logprob": lp, "bytes": list(p.encode()), "top_logprobs": []}
                                    for t, p, lp in zip(self._labels(comp.token_ids, body), pieces, comp.logprobs)]}
        choice = {"index": 0, "message": {"role": "assistant", "content": call.response_text},
                  "finish_reason": call.finish_reason, "logprobs": logprobs}
        return self._reply("chat.completion", choice, call, session)

    def completions(self, body: dict[str, Any], session: str | None, task: str | None) -> dict[str, Any]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        vocab = len(self.tokenizer)
        is_ids = isinstance(prompt, list) and len(prompt) > 0 and all(_is_int(t) and 0 <= t < vocab for t in prompt)
        _require(isinstance(prompt, str) and prompt != "" or is_ids, "prompt",
                 f"a non-empty string or a list of token ids in 0..{vocab - 1} (one prompt per request)", prompt)
        ids = list(prompt) if is_ids else self._encode(prompt)
        text = self.tokenizer.decode(ids, skip_special_tokens=False) if is_ids else prompt
        call, comp = self._complete(body, ids, text)
        if session:
            self.store.record(session, call, None, task)
        logprobs = None
        if body.get("logprobs") is not None and body.get("logprobs") is not False:
            logprobs = {"tokens": self._labels(comp.token_ids, body), "token_logprobs": list(comp.logprobs),
                        "top_logprobs": None}
        choice = {"index": 0, "text": call.response_text, "finish_reason": call.finish_reason, "logprobs": logprobs}
        return self._reply("text_completion", choice, call, session)

    def reward(self, session: str, body: dict[str, Any]) -> dict[str, Any]:
        reward = body.get("reward")
        _require(_is_number(reward), "reward", "a number", reward)
        for key in ("success", "truncated"):
            _require(isinstance(body.get(key, False), bool), key, "true or false", body.get(key))
        task, seed = body.get("task"), body.get("seed", 0)
        _require(task is None or isinstance(task, str) and task != "", "task", "a non-empty string", task)
        _require(_is_int(seed), "seed", "an integer", seed)
        try:
            traj = self.store.close(session, Outcome(float(reward), body.get("success", False),
                                                     body.get("truncated", False), task, seed))
        except UnknownSession:
            raise BadRequest(f"session {session!r} has no open episode (no call named it, it was closed already, or it "
                             f"was idle past serve.session_timeout_s): send its calls with the header {SESSION_HEADER}",
                             "session", 404) from None
        return {"session": session, "task": traj.task_key, "turns": traj.num_turns, "context": traj.context,
                "policy_version": traj.policy_version}

    # ---- internals ------------------------------------------------------------------------------------
    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _chat_prompt(self, messages: list[dict[str, str]], previous: Session | None) -> list[int]:
        """The prompt ids of ``messages``: the session's conversation continued exactly when they extend its last
        call by the reply it got and one user message, else the whole chat rendered afresh."""
        if previous is not None and previous.messages is not None:
            last, n = previous.calls[-1], len(previous.messages)
            said = {"role": "assistant", "content": last.response_text}
            if len(messages) == n + 2 and messages[:n] == previous.messages and messages[n] == said \
                    and messages[-1]["role"] == "user":
                ended_eos = bool(last.response_ids) and last.response_ids[-1] == self.tokenizer.eos_token_id
                glue = self.renderer.full_continuation(messages[-1]["content"], ended_eos)
                return last.prompt_ids + last.response_ids + glue
        return self._encode(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))

    def _complete(self, body: dict[str, Any], prompt: list[int], observation: str) -> tuple[Call, Completion]:
        params = sampling_of(body, self.defaults, self.fixed_temperature)
        if len(prompt) + params.max_new_tokens > self.max_context_tokens:
            raise BadRequest(f"the prompt's {len(prompt)} tokens + max_tokens={params.max_new_tokens} exceed the "
                             f"context of {self.max_context_tokens} tokens (rollout.max_context_tokens): shorten the "
                             "conversation or lower max_tokens", "max_tokens")
        try:
            with self.gate.generating(self.request_timeout_s):
                comp = self.engine.generate([prompt], params)[0]
        except TimeoutError:
            raise BadRequest(f"the engine stayed busy (a training update) for serve.request_timeout_s="
                             f"{self.request_timeout_s:g} s: retry the request", None, 503) from None
        text = self.tokenizer.decode(comp.token_ids, skip_special_tokens=True)
        return Call(list(prompt), list(comp.token_ids), list(comp.logprobs), text, comp.finish_reason, comp.version,
                    observation), comp

    def _pieces(self, ids: list[int]) -> list[str]:
        """Each token decoded alone (a token holding part of a UTF-8 character decodes to U+FFFD)."""
        return [self.tokenizer.decode([t], skip_special_tokens=False) for t in ids]

    def _labels(self, ids: list[int], body: dict[str, Any]) -> list[str]:
        """The reply's ``token`` fields: ``token_id:N`` when the request asks ``return_tokens_as_token_ids`` (vLLM's
        extension, exact), else each token's text."""
        return [f"token_id:{t}" for t in ids] if body.get("return_tokens_as_token_ids") else self._pieces(ids)

    def _reply(self, kind: str, choice: dict[str, Any], call: Call, session: str | None) -> dict[str, Any]:
        prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
        n_prompt, n_out = len(call.prompt_ids), len(call.response_ids)
        return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
                "model": self.model_name, "choices": [choice],
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
                "turnrl": {"session": session, "policy_version": call.version, "prompt_ids": call.prompt_ids,
                           "token_ids": call.response_ids}}


def _handler(server: RolloutServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = server.request_timeout_s  # a socket read or write that stalls this long ends the connection

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            """Quiet: a served agent makes many calls."""

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, server.models())
            else:
                self._error(BadRequest(f"no GET {self.path}: GET /v1/models lists the model", None, 404))

        def do_POST(self) -> None:
            try:
                body = self._body()
                session = self.headers.get(SESSION_HEADER) or body.get("user") or None
                _require(session is None or isinstance(session, str), "user", "a string (the session id)", session)
                task = self.headers.get(TASK_HEADER)
                path = self.path.rstrip("/")
                if path == "/v1/chat/completions":
                    self._send(200, server.chat(body, session, task))
                elif path == "/v1/completions":
                    self._send(200, server.completions(body, session, task))
                elif match := _REWARD_PATH.match(path):
                    self._send(200, server.reward(unquote(match.group(1)), body))
                else:
                    raise BadRequest(f"no POST {self.path}: the endpoints are /v1/chat/completions, /v1/completions "
                                     "and /v1/sessions/ID/reward", None, 404)
            except BadRequest as e:
                self._error(e)
            except Exception as e:  # noqa: BLE001 - an engine failure answers this request and keeps serving
                self._error(BadRequest(f"the engine failed: {type(e).__name__}: {e}", None, 500))

        def _body(self) -> dict[str, Any]:
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                raise BadRequest("the request has no Content-Length: send a JSON body", None, 411)
            if int(length) > MAX_BODY_BYTES:
                raise BadRequest(f"the body is {length} bytes, over {MAX_BODY_BYTES}: shorten the conversation", None, 413)
            raw = self.rfile.read(int(length))
            try:
                body = json.loads(raw)
            except (ValueError, RecursionError) as e:
                raise BadRequest(f"the body is not JSON ({e}): send a JSON object") from None
            _require(isinstance(body, dict), "the body", "a JSON object", body)
            return body

        def _error(self, e: BadRequest) -> None:
            kind = "invalid_request_error" if e.status < 500 else "server_error"
            self.close_connection = True  # the body may be unread
            self._send(e.status, {"error": {"message": str(e), "type": kind, "param": e.param, "code": e.status}})

        def _send(self, status: int, data: dict[str, Any]) -> None:
            payload = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Handler
