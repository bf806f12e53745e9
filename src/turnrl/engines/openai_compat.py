"""An engine that samples from a remote OpenAI-compatible server (vLLM, SGLang, OpenAI, ...), over HTTP.

Use it to evaluate an external model on an env or to collect trajectories from it. It cannot be trained:
a remote server's weights are not the learner's, so :meth:`OpenAICompatEngine.sync_weights` raises.

Two endpoints:

- ``endpoint="completions"`` (``POST {base_url}/completions``, the default). The prompt is sent as the
  token ids the collector built (``prompt_format="ids"``, exact: the server conditions on exactly those
  ids) or as their decoded text (``prompt_format="text"``, for servers that only take text: the server
  re-tokenises it, which is usually but not provably the same ids).
- ``endpoint="chat"`` (``POST {base_url}/chat/completions``). A chat server only takes messages, so the
  prompt ids are decoded and split back into messages (:func:`chatml_messages` by default, for ChatML
  templates such as SmolLM2's and Qwen's; pass ``messages_from_prompt`` for other templates). The server
  re-renders them with *its* chat template, so what the model conditioned on is approximate.

How returned tokens become ids (``Completion.stats["ids"]`` says which way was used):

1. ``"server"`` (exact): vLLM's ``return_tokens_as_token_ids`` makes each returned token read
   ``"token_id:1234"``. It is requested whenever ``vllm_extensions=True`` (the default).
2. ``"lookup"``: each returned token string (or its ``bytes`` on the chat endpoint) is looked up in a table
   ``tokenizer.decode([id]) -> id`` over the whole vocabulary. Exact when the server's tokenizer is this
   tokenizer and every piece decodes from exactly one id.
3. ``"retokenized"`` (approximate): some piece is missing or ambiguous (e.g. a partial UTF-8 byte
   sequence), so the completion text is re-tokenised; those ids may differ from what the server sampled
   and no per-token logprob can be attached to them. With ``require_logprobs=True`` this is an error; with
   ``require_logprobs=False`` (evaluation only) the logprobs are NaN, so a training loss that used them
   would be non-finite at once instead of silently wrong.

Logprob semantics are the server's. turnrl's convention is ``log_softmax(logits / temperature)`` at the
sampled token. vLLM reports the raw model logprob (before temperature) unless it is started with
``--logprobs-mode processed_logprobs`` (then temperature and top-k/top-p masking are applied, so the two
agree whenever top_p=1 and top_k=0). Hosted APIs do not document theirs.

Stops: ``stop_strings`` are sent as ``stop``. With ``vllm_extensions`` also ``stop_token_ids`` and
``include_stop_str_in_output=true`` (so, as in :class:`~turnrl.engines.HFEngine`, the tokens that
completed a stop string are kept). Stop token ids are also enforced here: the completion is cut after the
first one. A server that does not return its end-of-sequence token leaves it out of ``token_ids``.

Network behaviour: each prompt is one request; a batch runs on a thread pool of ``concurrency`` workers
and comes back in input order. ``timeout`` is a deadline for a whole attempt (connect, send, status line,
headers and body), not a limit per socket read, so a server that trickles bytes cannot hold a call longer
than a silent one. Connection errors, HTTP 429 and 5xx are retried up to ``max_retries`` times with
exponential backoff and jitter (``Retry-After`` is honoured up to ``max_backoff``); a request that timed
out is sent twice at most; other 4xx errors are not retried and end with a message naming the fix.
:class:`OpenAICompatEngine` states the resulting bound on the time to give up.

Every reply is checked against the shape the OpenAI API specifies (:mod:`turnrl.engines.openai_reply`);
one that breaks it raises :class:`RemoteEngineError` naming the server, the field and what was expected,
and is not retried.
"""

from __future__ import annotations

import http.client
import io
import json
import math
import os
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from turnrl.engines.base import Completion, SamplingParams, SeedStreamState
from turnrl.engines.openai_reply import Choice, MalformedReply, read_reply


class RemoteEngineError(RuntimeError):
    """The server could not be used as asked. The message names the problem and the fix."""


class NoLogprobsError(RemoteEngineError):
    """The server returned no per-token logprobs (or tokens that cannot be mapped to ids)."""


class NotTrainableError(RemoteEngineError):
    """Training tried to update the weights of a remote server."""


_RETRYABLE_NETWORK = (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException)
_TIMED_OUT_ATTEMPTS = 2  # a request that timed out this often is not sent again (see OpenAICompatEngine)


def chatml_messages(text: str) -> list[dict[str, str]]:
    """Split a rendered ChatML prompt (``<|im_start|>role\\ncontent<|im_end|>``) back into messages.

    The trailing open assistant header (the generation prompt) is dropped: the chat endpoint adds its own.
    Raises ``ValueError`` when ``text`` is not ChatML or ends inside a started assistant message (a chat
    endpoint cannot continue a partial message; use ``endpoint="completions"``).
    """
    start, end = "<|im_start|>", "<|im_end|>"
    if start not in text:
        raise ValueError(
            "the prompt is not ChatML (no <|im_start|>); pass messages_from_prompt= for this chat template "
            "or use endpoint='completions'"
        )
    messages: list[dict[str, str]] = []
    for chunk in text.split(start)[1:]:
        role, _, body = chunk.partition("\n")
        closed = end in body
        content = body.split(end, 1)[0]
        if not closed:
            if role.strip() == "assistant" and content == "":
                continue  # the generation prompt
            raise ValueError(f"the prompt ends inside an unfinished {role.strip()!r} message; a chat endpoint cannot "
                             "continue it; use endpoint='completions'")
        messages.append({"role": role.strip(), "content": content})
    return messages


class OpenAICompatEngine(SeedStreamState):
    """Engine protocol over ``/v1/completions`` or ``/v1/chat/completions``; see the module docstring.

    ``tokenizer`` must be the served model's tokenizer: it decodes prompt ids where the server needs
    text and maps returned tokens to ids. ``api_key`` defaults to ``$OPENAI_API_KEY`` (none is sent when
    neither is set, which is what a local vLLM server expects). ``seed`` seeds the per-request ``seed``
    field, drawn in input order, so a rerun sends the same seeds (servers that honour it, like vLLM,
    then sample the same tokens).

    Time to give up. Each attempt must deliver its whole response within ``timeout`` seconds (over HTTPS, a
    TCP connect and a TLS handshake that both stall can take up to twice that). Connection errors, HTTP 429
    and 5xx are retried up to ``max_retries`` times; before retry ``k`` (from 0) the engine waits at most
    ``min(max_backoff, backoff * 2**k)``. A timed-out request is sent twice at most: a loaded server gets a
    second chance, but the same request under the same deadline would most likely time out a third time too
    (a slow server needs a larger ``timeout``). So one request fails within

        (max_retries + 1) * timeout + sum(min(max_backoff, backoff * 2**k) for k < max_retries)

    seconds (defaults: 5 * 60 + 7.5 = 307.5 s, only if every attempt fails just before its deadline), and a
    server that accepts connections but never answers is reported within ``2 * timeout + backoff``
    (defaults: 120.5 s). The error states the time taken and which of ``timeout=`` / ``max_retries=`` to
    raise. A batch runs ``concurrency`` requests at once and fails at its first failed request, in input order.
    """

    trainable = False

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer,
        *,
        endpoint: Literal["completions", "chat"] = "completions",
        prompt_format: Literal["ids", "text"] = "ids",
        api_key: str | None = None,
        require_logprobs: bool = True,
        vllm_extensions: bool = True,
        timeout: float = 60.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        concurrency: int = 8,
        seed: int = 0,
        send_seed: bool = True,
        extra_body: dict[str, Any] | None = None,
        messages_from_prompt: Callable[[str], list[dict[str, str]]] = chatml_messages,
    ) -> None:
        if endpoint not in ("completions", "chat"):
            raise ValueError(f"endpoint must be 'completions' or 'chat', got {endpoint!r}")
        if prompt_format not in ("ids", "text"):
            raise ValueError(f"prompt_format must be 'ids' or 'text', got {prompt_format!r}")
        if max_retries < 0 or timeout <= 0 or concurrency < 1:
            raise ValueError("need max_retries >= 0, timeout > 0 and concurrency >= 1")
        base = base_url.rstrip("/")
        self.base_url = base if base.endswith("/v1") else base + "/v1"
        self.model = model
        self.tokenizer = tokenizer
        self.endpoint = endpoint
        self.prompt_format = prompt_format
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.require_logprobs = require_logprobs
        self.vllm_extensions = vllm_extensions
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.concurrency = concurrency
        self.send_seed = send_seed
        self.extra_body = dict(extra_body or {})
        self.messages_from_prompt = messages_from_prompt
        self.version = 0  # a remote server's weights never change under turnrl
        self.rng = random.Random(seed)  # per-request seeds
        self._jitter = random.Random()  # backoff jitter: must not disturb the seed stream
        self._sleep: Callable[[float], None] = time.sleep
        self._piece_table: dict[str, int | None] | None = None
        self._piece_lock = threading.Lock()  # the table is built once, by whichever worker thread needs it first

    # ---- protocol -------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """One request per prompt, ``concurrency`` at a time; results in input order."""
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if params.top_k > 0 and not self.vllm_extensions:
            raise ValueError("top_k needs a server that accepts vLLM's 'top_k' field: set vllm_extensions=True "
                             "(the OpenAI API has no top-k) or sample with top_k=0")
        seeds = [self.rng.randrange(2**31) for _ in prompts]
        if not prompts:
            return []
        workers = min(self.concurrency, len(prompts))
        if workers == 1:
            return [self._complete(p, params, s) for p, s in zip(prompts, seeds)]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="turnrl-openai") as pool:
            futures = [pool.submit(self._complete, p, params, s) for p, s in zip(prompts, seeds)]
            try:
                return [f.result() for f in futures]  # input order; the first failure (in order) propagates
            except BaseException:
                for f in futures:
                    f.cancel()
                raise

    def sync_weights(self) -> None:
        raise NotTrainableError(
            f"{self.base_url} serves {self.model!r} with its own weights; turnrl cannot update them, so this engine "
            "can evaluate and collect trajectories but not train. Train with the in-process engine (HFEngine) or "
            "VLLMEngine, which load the learner's weights."
        )

    # ---- one request ------------------------------------------------------------------------
    def _complete(self, prompt: list[int], params: SamplingParams, seed: int) -> Completion:
        t0 = time.perf_counter()
        body = self._request_body(prompt, params, seed)
        path = "/chat/completions" if self.endpoint == "chat" else "/completions"
        data, attempts = self._post(path, body)
        try:
            choice = read_reply(data, self.endpoint, len(self.tokenizer))
        except MalformedReply as e:
            raise RemoteEngineError(
                f"{self.base_url}{path} sent a reply that does not follow the OpenAI API: {e}; check that --base-url "
                "is an OpenAI-compatible server (vLLM, SGLang, ...)"
            ) from None
        comp = self._completion(choice, params)
        comp.stats.update(attempts=attempts, latency_s=time.perf_counter() - t0)
        return comp

    def _request_body(self, prompt: list[int], params: SamplingParams, seed: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "n": 1,
        }
        text = None
        if self.endpoint == "chat" or self.prompt_format == "text":
            text = self.tokenizer.decode(prompt, skip_special_tokens=False)
        if self.endpoint == "chat":
            try:
                body["messages"] = self.messages_from_prompt(text)
            except ValueError as e:
                raise RemoteEngineError(f"cannot send this prompt to a chat endpoint: {e}") from None
            body["logprobs"] = True
        else:
            body["prompt"] = list(prompt) if self.prompt_format == "ids" else text
            body["logprobs"] = 1  # the sampled token's logprob (plus one alternative, which is ignored)
        if params.stop_strings:
            body["stop"] = list(params.stop_strings)
        if self.send_seed:
            body["seed"] = seed
        if self.vllm_extensions:
            body["return_tokens_as_token_ids"] = True
            if params.stop_token_ids:
                body["stop_token_ids"] = list(params.stop_token_ids)
            if params.top_k > 0:
                body["top_k"] = params.top_k
            if params.stop_strings:
                body["include_stop_str_in_output"] = True
        body.update(self.extra_body)
        return body

    def _completion(self, choice: Choice, params: SamplingParams) -> Completion:
        finish = "length" if choice.finish_reason == "length" else "stop"
        ids, how = None, "retokenized"
        if choice.logprobs is not None and None not in choice.logprobs:
            if choice.server_ids is not None:
                ids, how = choice.server_ids, "server"
            else:
                ids, how = self._lookup_ids(choice.pieces, choice.piece_bytes)
        if ids is None:
            if self.require_logprobs:
                raise NoLogprobsError(self._no_logprobs_message(choice.pieces is not None))
            ids = list(self.tokenizer(choice.text, add_special_tokens=False)["input_ids"])
            logprobs = [math.nan] * len(ids)
            how = "retokenized"
        else:
            logprobs = [float(x) for x in choice.logprobs]
        for i, t in enumerate(ids):  # enforce stop token ids here too (servers without stop_token_ids)
            if t in params.stop_token_ids:
                ids, logprobs, finish = ids[: i + 1], logprobs[: i + 1], "stop"
                break
        return Completion(ids, logprobs, finish, version=self.version,
                          stats={"ids": how, "server_finish_reason": choice.finish_reason})

    def _no_logprobs_message(self, got_tokens: bool) -> str:
        if got_tokens:
            return (f"{self.base_url} returned tokens that do not map one-to-one onto this tokenizer's ids, so "
                    "behaviour logprobs cannot be attached to exact ids. Use a vLLM server (turnrl asks it for "
                    "return_tokens_as_token_ids), check that the tokenizer is the served model's, or pass "
                    "require_logprobs=False for evaluation only")
        return (f"{self.base_url} returned no per-token logprobs for model {self.model!r}. Training data needs "
                "them: use a server that returns logprobs (vLLM, SGLang; hosted APIs often disable them for "
                "some models) or enable them on the server; for evaluation only pass require_logprobs=False")

    # ---- token mapping ------------------------------------------------------------------------
    def _lookup_ids(self, pieces: Sequence[str],
                    piece_bytes: Sequence[list[int] | None] | None) -> tuple[list[int] | None, str]:
        """Each returned piece (its bytes, where given) looked up in the vocabulary; None if one is missing or
        ambiguous."""
        table = self._pieces()
        ids = []
        for i, p in enumerate(pieces):
            if piece_bytes is not None and piece_bytes[i] is not None:
                p = bytes(piece_bytes[i]).decode("utf-8", errors="replace")
            tid = table.get(p)
            if tid is None:  # missing or ambiguous
                return None, "retokenized"
            ids.append(tid)
        return ids, "lookup"

    def _pieces(self) -> dict[str, int | None]:
        """``decode([id]) -> id`` over the vocabulary; ``None`` marks pieces that decode from several ids."""
        with self._piece_lock:
            if self._piece_table is None:
                table: dict[str, int | None] = {}
                for tid in range(len(self.tokenizer)):
                    piece = self.tokenizer.decode([tid], skip_special_tokens=False)
                    table[piece] = None if piece in table else tid
                self._piece_table = table
            return self._piece_table

    # ---- HTTP ---------------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def _post(self, path: str, body: dict[str, Any]) -> tuple[Any, int]:
        """POST JSON with the retries of the class docstring; returns ``(decoded reply, attempts used)``."""
        url = self.base_url + path
        payload = json.dumps(body).encode()
        start, timeouts, last = time.monotonic(), 0, ""
        for attempt in range(1, self.max_retries + 2):
            retry_after = None
            try:
                return self._attempt(url, payload), attempt
            except urllib.error.HTTPError as e:
                msg = _error_message(e)
                if e.code != 429 and e.code < 500:
                    raise self._client_error(e.code, msg, url) from None
                last = f"HTTP {e.code}: {msg}"
                retry_after = _retry_after(e.headers.get("Retry-After") if e.headers else None)
            except _RETRYABLE_NETWORK as e:
                reason = getattr(e, "reason", e)
                if isinstance(reason, TimeoutError):
                    timeouts += 1
                    if timeouts == _TIMED_OUT_ATTEMPTS or attempt > self.max_retries:
                        raise self._no_answer(url, attempt, time.monotonic() - start) from None
                last = f"{type(reason).__name__}: {reason}"
            if attempt <= self.max_retries:
                self._sleep(self._delay(attempt - 1, retry_after))
        raise RemoteEngineError(
            f"request to {url} failed after {self.max_retries + 1} attempts in {time.monotonic() - start:.1f} s (last: "
            f"{last}). Check that the server is up and reachable, or raise timeout= (now {self.timeout:g}s) / "
            f"max_retries= (now {self.max_retries}) (turnrl eval --timeout / --max-retries)"
        )

    def _attempt(self, url: str, payload: bytes) -> Any:
        """One POST whose whole response must arrive within ``timeout`` s; returns the decoded JSON."""
        req = urllib.request.Request(url, data=payload, headers=self._headers(), method="POST")
        with _OPENER.open(req, timeout=self.timeout) as resp:
            raw = resp.read()
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's depth
            raise RemoteEngineError(f"{url} answered with something that is not JSON: {raw[:200]!r}; "
                                    "is --base-url an OpenAI-compatible server (ending in /v1)?") from None

    def _no_answer(self, url: str, attempts: int, elapsed: float) -> RemoteEngineError:
        return RemoteEngineError(
            f"no answer from {url} within {self.timeout:g} s after {attempts} attempt{'s' if attempts > 1 else ''} "
            f"({elapsed:.1f} s in all; a timed-out request is sent twice at most). Check that the server is up; if it "
            f"is only slow, raise timeout= (now {self.timeout:g}s; turnrl eval --timeout)"
        )

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        """Exponential backoff with "equal jitter": half the step is fixed, half uniform; capped."""
        step = min(self.max_backoff, self.backoff * 2**attempt)
        delay = step / 2 + self._jitter.uniform(0, step / 2)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.max_backoff))
        return delay

    def _client_error(self, status: int, msg: str, url: str) -> RemoteEngineError:
        if status in (401, 403):
            return RemoteEngineError(
                f"{url} rejected the API key (HTTP {status}: {msg}). Set OPENAI_API_KEY (or pass api_key= / "
                "--api-key-env) to a key this server accepts"
            )
        if status == 404:
            served = self._served_models()
            hint = f" The server serves: {', '.join(served)}." if served else " Check --api-model and --base-url (it should end in /v1)."
            return RemoteEngineError(f"{url}: HTTP 404 for model {self.model!r} ({msg}).{hint}")
        return RemoteEngineError(f"{url} rejected the request (HTTP {status}: {msg}); it is not retried")

    def _served_models(self) -> list[str]:
        """Model ids from ``GET /models`` (one attempt; empty on any failure)."""
        try:
            req = urllib.request.Request(self.base_url + "/models", headers=self._headers(), method="GET")
            with _OPENER.open(req, timeout=self.timeout) as resp:
                return [str(m["id"]) for m in json.loads(resp.read()).get("data", [])]
        except Exception:
            return []


def _error_message(e: urllib.error.HTTPError) -> str:
    """The server's own error message (OpenAI shape ``{"error": {"message": ...}}``), else the raw body."""
    try:
        raw = e.read().decode("utf-8", errors="replace")
    except Exception:
        return _one_line(e.reason if isinstance(e.reason, str) else str(e))
    try:
        data = json.loads(raw)
        err = data.get("error", data) if isinstance(data, dict) else data
        if isinstance(err, dict) and "message" in err:
            return _one_line(str(err["message"]))
        if isinstance(data, dict) and "detail" in data:
            return _one_line(str(data["detail"]))
    except (ValueError, RecursionError):
        pass
    return _one_line(raw) or str(e.reason)


def _one_line(text: str, limit: int = 300) -> str:
    """``text`` with its whitespace runs (newlines of an HTML error page, say) collapsed, cut at ``limit``."""
    return " ".join(text.split())[:limit]


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: ignore, use our own backoff


# ---- the deadline of one attempt ------------------------------------------------------------------
def _time_left(deadline: float) -> float:
    """Seconds until ``deadline`` (``time.monotonic()`` time); ``TimeoutError`` once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline passed")
    return left


class _DeadlineReader(io.RawIOBase):
    """A socket's reader that gives every read only the time left before ``deadline``, not a fresh timeout."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock, self._raw, self._deadline = sock, sock.makefile("rb", buffering=0), deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int | None:
        self._sock.settimeout(_time_left(self._deadline))
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()  # releases the socket (http.client closes it once its files are closed)
        super().close()


class _DeadlineSocket:
    """What :class:`http.client.HTTPResponse` sees of the socket: its one file reads under the deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock, self._deadline = sock, deadline

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))


class _DeadlineHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection whose ``timeout`` is one deadline for everything after it is made: connecting,
    sending, and reading the status line, headers and body. http.client applies ``timeout`` to each socket
    operation, so a server sending a byte a second would never trip it. (Over HTTPS the TLS handshake, which
    http.client runs inside ``connect``, gets the time that was left when connecting began.)"""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._deadline = time.monotonic() + self.timeout

    def connect(self) -> None:
        self.timeout = _time_left(self._deadline)
        super().connect()

    def send(self, data) -> None:
        if self.sock is not None:
            self.sock.settimeout(_time_left(self._deadline))
        super().send(data)

    def response_class(self, sock: socket.socket, *args, **kwargs) -> http.client.HTTPResponse:
        """http.client builds each response (and a proxy tunnel's) with ``self.response_class(sock, ...)``."""
        return http.client.HTTPResponse(_DeadlineSocket(sock, self._deadline), *args, **kwargs)


class _DeadlineHTTPSConnection(_DeadlineHTTPConnection, http.client.HTTPSConnection):
    """:class:`_DeadlineHTTPConnection` over TLS."""


class _DeadlineHTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_DeadlineHTTPConnection, req)


class _DeadlineHTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_DeadlineHTTPSConnection, req, context=self._context)


# urllib's default handlers (proxies from the environment, redirects, HTTP errors) with deadline connections
_OPENER = urllib.request.build_opener(_DeadlineHTTPHandler, _DeadlineHTTPSHandler)
