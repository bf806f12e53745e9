"""A tiny OpenAI-compatible server on loopback for tests: ``/v1/completions``, ``/v1/chat/completions``,
``/v1/models``, deterministic replies with per-token logprobs, and scripted failures.

The reply text comes from ``reply(prompt_text)`` (the decoded prompt, or for the chat endpoint the
messages rendered back with the tokenizer's chat template), is tokenised with the real tokenizer, cut at
``max_tokens`` / ``stop`` / ``stop_token_ids`` like vLLM does, and token ``j`` gets logprob
``-0.01 * (j + 1)``. With ``return_tokens_as_token_ids`` tokens read ``"token_id:N"`` (vLLM), otherwise
each is the decoded piece (OpenAI).

Failures are scripted per request through ``server.script``: each request pops the next item, an HTTP
status (``503``, ``429``, ...), ``"no_logprobs"`` (a 200 without logprobs), ``("slow", seconds)``
(answer after sleeping), ``("trickle", seconds)`` (send the whole HTTP response, status line and headers
included, one byte per ``seconds``) or ``("body", bytes)`` (a 200 whose body is exactly those bytes).
``server.delay(body) -> seconds`` delays every request (to scramble completion order). ``server.requests``
records every request body; ``server.api_key`` (if set) is required. ``server.answer(path, body)`` is the
reply a request would get.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class StubOpenAIServer:
    def __init__(self, tokenizer, reply: Callable[[str], str] = lambda prompt: "Right", model: str = "stub-model") -> None:
        self.tokenizer = tokenizer
        self.reply = reply
        self.model = model
        self.api_key: str | None = None
        self.script: deque[Any] = deque()
        self.delay: Callable[[dict[str, Any]], float] = lambda body: 0.0
        self.requests: list[dict[str, Any]] = []
        self.request_times: list[float] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> "StubOpenAIServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # ---- the model ----------------------------------------------------------------------------
    def _generate(self, prompt_text: str, body: dict[str, Any]) -> tuple[list[int], str]:
        ids = list(self.tokenizer(self.reply(prompt_text), add_special_tokens=False)["input_ids"])
        finish = "stop"
        stop_ids = set(body.get("stop_token_ids") or [])
        for i, t in enumerate(ids):
            if t in stop_ids:
                return ids[: i + 1], "stop"
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        for i in range(1, len(ids) + 1):
            text = self.tokenizer.decode(ids[:i])
            if any(s in text for s in stops):
                return ids[:i] if body.get("include_stop_str_in_output") else ids[: i - 1], "stop"
        if len(ids) > body.get("max_tokens", 16):
            ids, finish = ids[: body["max_tokens"]], "length"
        return ids, finish

    def _token(self, tid: int, body: dict[str, Any]) -> str:
        return f"token_id:{tid}" if body.get("return_tokens_as_token_ids") else self.tokenizer.decode([tid])

    def _completions(self, body: dict[str, Any], logprobs: bool) -> dict[str, Any]:
        prompt = body["prompt"]
        text = self.tokenizer.decode(prompt, skip_special_tokens=False) if isinstance(prompt, list) else prompt
        ids, finish = self._generate(text, body)
        choice: dict[str, Any] = {"index": 0, "text": self.tokenizer.decode(ids, skip_special_tokens=True), "finish_reason": finish}
        choice["logprobs"] = {
            "tokens": [self._token(t, body) for t in ids],
            "token_logprobs": [-0.01 * (j + 1) for j in range(len(ids))],
            "top_logprobs": [{} for _ in ids],
            "text_offset": [0 for _ in ids],
        } if logprobs and body.get("logprobs") is not None else None
        return {"id": "cmpl-stub", "object": "text_completion", "model": self.model, "choices": [choice]}

    def _chat(self, body: dict[str, Any], logprobs: bool) -> dict[str, Any]:
        text = self.tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=False)
        ids, finish = self._generate(text, body)
        content = self.tokenizer.decode(ids, skip_special_tokens=True)
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}
        choice["logprobs"] = {"content": [
            {"token": self._token(t, body), "logprob": -0.01 * (j + 1),
             "bytes": list(self.tokenizer.decode([t]).encode()), "top_logprobs": []}
            for j, t in enumerate(ids)
        ]} if logprobs and body.get("logprobs") else None
        return {"id": "chatcmpl-stub", "object": "chat.completion", "model": self.model, "choices": [choice]}

    def answer(self, path: str, body: dict[str, Any], logprobs: bool = True) -> dict[str, Any] | None:
        """The JSON reply to ``body`` on ``path`` (``/v1/completions`` or ``/v1/chat/completions``); None: no route."""
        if path == "/v1/completions":
            return self._completions(body, logprobs)
        if path == "/v1/chat/completions":
            return self._chat(body, logprobs)
        return None

    # ---- HTTP ---------------------------------------------------------------------------------
    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                self._send_bytes(status, json.dumps(payload).encode(), headers)

            def _send_bytes(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

            def _trickle(self, payload: dict[str, Any], interval: float) -> None:
                data = json.dumps(payload).encode()
                head = f"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
                try:
                    for byte in head.encode() + data:
                        self.wfile.write(bytes([byte]))
                        time.sleep(interval)
                except OSError:
                    pass  # the client gave up

            def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
                self._send(status, {"error": {"message": message, "type": "stub", "code": status}}, headers)

            def _authorised(self) -> bool:
                if server.api_key and self.headers.get("Authorization") != f"Bearer {server.api_key}":
                    self._error(401, "Incorrect API key provided.")
                    return False
                return True

            def do_GET(self) -> None:
                if not self._authorised():
                    return
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": server.model, "object": "model"}]})
                else:
                    self._error(404, f"no route {self.path}")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with server._lock:
                    server.requests.append(body)
                    server.request_times.append(time.monotonic())
                    action = server.script.popleft() if server.script else None
                if not self._authorised():
                    return
                time.sleep(server.delay(body))
                if isinstance(action, int):
                    self._error(action, f"scripted HTTP {action}", {"Retry-After": "0"} if action == 429 else None)
                    return
                kind, arg = action if isinstance(action, tuple) else (action, None)
                if kind == "body":
                    return self._send_bytes(200, arg)
                if kind == "slow":
                    time.sleep(arg)
                if body.get("model") != server.model:
                    self._error(404, f"The model `{body.get('model')}` does not exist.")
                    return
                payload = server.answer(self.path, body, logprobs=kind != "no_logprobs")
                if payload is None:
                    self._error(404, f"no route {self.path}")
                elif kind == "trickle":
                    self._trickle(payload, arg)
                else:
                    self._send(200, payload)

        return Handler
