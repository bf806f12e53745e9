"""Find tool calls in model text.

Two formats are read, in this order:

1. ``<tool_call>{"name": "calculate", "arguments": {"expression": "2+3"}}</tool_call>`` (Hermes/Qwen style).
   A response may hold several; when the text has any ``<tool_call>`` tag only tagged calls count. A final
   tag left unclosed (generation stopped at a stop string) is read up to the end of the text.
2. Otherwise, bare JSON objects anywhere in the text with a ``"name"`` key: ``{"name": ..., "arguments": ...}``.

``"parameters"`` is accepted for ``"arguments"`` (Llama 3 style), and arguments given as a JSON string
(OpenAI style) are decoded. Nothing here raises on model text: a tag whose body is not a JSON object with a
string ``"name"`` (or is nested too deeply for Python's JSON decoder) becomes an error message in
:attr:`ParsedCalls.errors`, for the env to show the model.
At most ``limit`` calls are returned; the number dropped is in :attr:`ParsedCalls.dropped`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_TAG = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")
_OBJECT_START = re.compile(r'\{\s*"')


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool's name and its arguments (not yet validated)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def signature(self) -> str:
        """A canonical text of the call, ``name({"arg": value})`` with sorted keys (used in info["actions"])."""
        return f"{self.name}({json.dumps(self.arguments, sort_keys=True, ensure_ascii=False)})"

    def to_text(self) -> str:
        """The call in the ``<tool_call>`` format the parser reads."""
        body = json.dumps({"name": self.name, "arguments": self.arguments}, ensure_ascii=False)
        return f"<tool_call>{body}</tool_call>"


@dataclass
class ParsedCalls:
    """The calls found in one response, messages about malformed ones, and how many were over the limit."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    dropped: int = 0


def parse_tool_calls(text: str, limit: int = 1) -> ParsedCalls:
    """The tool calls in ``text`` (see the module docstring); at most ``limit`` of them."""
    out = ParsedCalls()
    bodies = _TAG.findall(text) if "<tool_call>" in text else None
    if bodies is not None:
        for i, body in enumerate(bodies, 1):
            body = _FENCE.sub("", body.strip())
            try:
                obj = json.loads(body)
            except json.JSONDecodeError as e:
                out.errors.append(f"tool call {i} is not valid JSON ({e.msg} at character {e.pos}): {body[:80]!r}")
                continue
            except RecursionError:  # json's decoder recurses once per nesting level
                out.errors.append(f"tool call {i} is nested too deeply to read: {body[:80]!r}")
                continue
            _add(out, obj, f"tool call {i}")
    else:
        for obj in _bare_json_objects(text):
            if isinstance(obj, dict) and "name" in obj:
                _add(out, obj, "the JSON tool call")
    if len(out.calls) > limit:
        out.dropped = len(out.calls) - limit
        out.calls = out.calls[: max(0, limit)]
    return out


def _add(out: ParsedCalls, obj: Any, where: str) -> None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"].strip():
        out.errors.append(f'{where} must be a JSON object like {{"name": "tool", "arguments": {{...}}}}')
        return
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI-style arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            out.errors.append(f"{where}: the arguments of {obj['name']} are a string that is not a JSON object")
            return
    if args is None:
        args = {}
    if not isinstance(args, dict):
        out.errors.append(f"{where}: the arguments of {obj['name']} must be a JSON object, got {type(args).__name__}")
        return
    out.calls.append(ToolCall(obj["name"].strip(), args))


def _bare_json_objects(text: str) -> list[Any]:
    """Every top-level JSON object in ``text`` that could hold a ``"name"``, scanning left to right.

    Only an opening ``{"`` starts an attempt (an object with a key opens that way), so text full of other braces
    costs one regex pass rather than one failed decode per brace. An object nested too deeply for Python's
    decoder (``RecursionError``) is skipped up to the last ``{"`` before its first ``}`` (where the innermost
    object that can close starts), rather than retried at every level of the nesting.
    """
    decoder = json.JSONDecoder()
    found, end = [], 0
    for start in _OBJECT_START.finditer(text):
        if start.start() < end:  # inside an object already read, or skipped
            continue
        try:
            obj, end = decoder.raw_decode(text, start.start())
        except json.JSONDecodeError:
            continue
        except RecursionError:
            close = text.find("}", start.start())
            inner = list(_OBJECT_START.finditer(text, start.start() + 1, close)) if close != -1 else []
            end = inner[-1].start() if inner else len(text)
            continue
        found.append(obj)
    return found
