"""The shape of a reply from an OpenAI-compatible server, checked before anything is read from it.

:func:`read_reply` takes the decoded JSON of a ``/v1/completions`` or ``/v1/chat/completions`` reply and
returns its first choice as a :class:`Choice`, or raises :class:`MalformedReply` naming the first field
that breaks the API (``choices[0].logprobs.token_logprobs[3] should be a log-probability ..., got 'x'``).
What is checked, as the OpenAI API specifies it: the reply is an object; ``usage`` holds counts;
``choices`` is a non-empty list of objects; ``finish_reason`` is a string; ``text`` (completions) is a
string, ``message`` (chat) an object with string content; logprobs are objects whose token lists hold
strings, whose logprobs are finite numbers <= 0 (or null: none for that token) and as many as the tokens,
whose ``bytes`` are byte values; vLLM's ``token_id:N`` tokens name ids inside the vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class MalformedReply(Exception):
    """A reply breaks the OpenAI API's shape; the message is ``<field> should be <expected>, got <value>``."""


@dataclass
class Choice:
    """The first choice of a reply, checked. The lists run over the returned tokens; they are None when the
    reply carries no per-token logprobs (a logprob may still be None: the server gave none for that token)."""

    text: str
    finish_reason: str | None
    pieces: list[str] | None
    piece_bytes: list[list[int] | None] | None  # chat endpoint: each token's UTF-8 bytes, where given
    logprobs: list[float | None] | None
    server_ids: list[int] | None  # vLLM's "token_id:N" tokens, as ids


def _check(ok: bool, field: str, expected: str, value: Any) -> None:
    if not ok:
        got = repr(value)
        raise MalformedReply(f"{field} should be {expected}, got {got if len(got) <= 80 else got[:77] + '...'}")


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _is_logprob(x: Any) -> bool:
    """A log-probability: a finite number <= 0 (NaN fails both comparisons)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and -math.inf < x <= 0


_LOGPROB = "a log-probability (a finite number <= 0) or null"


def _checked_list(value: Any, field: str, item: str, ok: Callable[[Any], bool]) -> list:
    _check(isinstance(value, list), field, "a list", value)
    for i, x in enumerate(value):
        _check(ok(x), f"{field}[{i}]", item, x)
    return value


def _optional_object(choice: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = choice.get(key)
    _check(value is None or isinstance(value, dict), f"choices[0].{key}", "an object or null", value)
    return value


def read_reply(data: Any, endpoint: str, vocab_size: int) -> Choice:
    """The first choice of a decoded reply from ``endpoint``; raises ``MalformedReply`` at the first field that
    breaks the API. ``token_id:N`` tokens must name ids of a ``vocab_size`` vocabulary."""
    _check(isinstance(data, dict), "the reply", "a JSON object", data)
    usage = data.get("usage")
    _check(usage is None or isinstance(usage, dict), "usage", "an object or null", usage)
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        count = (usage or {}).get(key)
        _check(count is None or _is_count(count), f"usage.{key}", "a count (an integer >= 0) or null", count)
    choices = data.get("choices")
    _check(isinstance(choices, list) and len(choices) > 0, "choices", "a non-empty list", choices)
    choice = choices[0]
    _check(isinstance(choice, dict), "choices[0]", "an object", choice)
    finish = choice.get("finish_reason")
    _check(finish is None or isinstance(finish, str), "choices[0].finish_reason", "a string or null", finish)
    read = _read_chat_choice if endpoint == "chat" else _read_text_choice
    return read(choice, finish, vocab_size)


def _read_text_choice(choice: dict[str, Any], finish: str | None, vocab_size: int) -> Choice:
    """``/completions``: ``text`` and ``logprobs.tokens`` / ``logprobs.token_logprobs``."""
    text = choice.get("text")
    _check(isinstance(text, str), "choices[0].text", "a string", text)
    lp = _optional_object(choice, "logprobs")
    if lp is None:
        return Choice(text, finish, None, None, None, None)
    pieces = _checked_list(lp.get("tokens"), "choices[0].logprobs.tokens", "a string", lambda p: isinstance(p, str))
    logprobs = _checked_list(lp.get("token_logprobs"), "choices[0].logprobs.token_logprobs", _LOGPROB,
                             lambda x: x is None or _is_logprob(x))
    _check(len(logprobs) == len(pieces), "choices[0].logprobs.token_logprobs", f"as long as tokens ({len(pieces)})",
           len(logprobs))
    server_ids = _server_ids(pieces, "choices[0].logprobs.tokens[{}]", vocab_size)
    return Choice(text, finish, pieces, None, logprobs, server_ids)


def _read_chat_choice(choice: dict[str, Any], finish: str | None, vocab_size: int) -> Choice:
    """``/chat/completions``: ``message.content`` and ``logprobs.content[i]`` = ``{token, logprob, bytes}``."""
    message = choice.get("message")
    _check(isinstance(message, dict), "choices[0].message", "an object", message)
    text = message.get("content")
    _check(text is None or isinstance(text, str), "choices[0].message.content", "a string or null", text)
    lp = _optional_object(choice, "logprobs")
    entries = None if lp is None else lp.get("content")
    if entries is None:
        return Choice(text or "", finish, None, None, None, None)
    _check(isinstance(entries, list), "choices[0].logprobs.content", "a list or null", entries)
    for i, entry in enumerate(entries):
        where = f"choices[0].logprobs.content[{i}]"
        _check(isinstance(entry, dict), where, "an object", entry)
        token, logprob, raw = entry.get("token"), entry.get("logprob"), entry.get("bytes")
        _check(isinstance(token, str), f"{where}.token", "a string", token)
        _check(logprob is None or _is_logprob(logprob), f"{where}.logprob", _LOGPROB, logprob)
        _check(raw is None or (isinstance(raw, list) and all(_is_count(b) and b < 256 for b in raw)),
               f"{where}.bytes", "a list of byte values (0 to 255) or null", raw)
    pieces = [e["token"] for e in entries]
    return Choice(text or "", finish, pieces, [e.get("bytes") for e in entries], [e.get("logprob") for e in entries],
                  _server_ids(pieces, "choices[0].logprobs.content[{}].token", vocab_size))


def _server_ids(pieces: list[str], field: str, vocab_size: int) -> list[int] | None:
    """vLLM's ``token_id:N`` tokens (``return_tokens_as_token_ids``) as ids; None when the tokens are text.
    ``field`` names token ``i`` as ``field.format(i)``."""
    prefix = "token_id:"
    if not pieces or not all(p.startswith(prefix) for p in pieces):
        return None
    ids = []
    for i, p in enumerate(pieces):
        digits = p[len(prefix):]
        ok = digits.isascii() and digits.isdigit() and int(digits) < vocab_size
        _check(ok, field.format(i), f"'token_id:N' with N in 0..{vocab_size - 1}", p)
        ids.append(int(digits))
    return ids
