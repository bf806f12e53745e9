"""Typed Python functions as tools: a JSON schema from the signature and docstring, and argument validation.

    @tool
    def calculate(expression: str) -> str:
        \"\"\"Evaluate an arithmetic expression.

        Args:
            expression: numbers with + - * / and parentheses, e.g. "(3 + 5) * 2".
        \"\"\"

``calculate`` is then a :class:`Tool`: calling it still calls the function; ``calculate.schema`` is the
OpenAI-style function schema (``{"type": "function", "function": {"name", "description", "parameters"}}``,
the shape ``tokenizer.apply_chat_template(tools=...)`` accepts). Supported parameter types: ``int``,
``float``, ``str``, ``bool``, ``list[X]``, ``Optional[X]`` / ``X | None``, ``Literal[...]`` (one value type).
A parameter without a default is required. The description is the docstring's text before its sections;
per-argument descriptions come from a Google-style ``Args:`` section.

:func:`validate_arguments` checks model-supplied arguments against the signature strictly (a ``"3"`` is not
an int; an int is accepted for a float; a bool is never a number) and raises :class:`ToolArgumentError`
with a message meant for the model.

Why not ``transformers.utils.get_json_schema``: for every tool turnrl ships it gives the same schema (a test
checks it, ``tests/test_tools.py``), but importing it loads transformers and torch (about 2.5 s and 270 MB
per process, measured), and tools belong to the env layer: every env server and env-pool process would pay
that for ~60 lines. It also accepts types the validator below cannot check (``dict``,
``Any``, enums, unions of several types) and adds a ``"return"`` entry that OpenAI's function schema lacks.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Union

_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):\s*$")
_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")
_JSON_TYPES: dict[type, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}


class ToolError(Exception):
    """A recoverable tool failure whose message goes back to the model as an observation (a bad query, ...)."""


class ToolArgumentError(ToolError):
    """The arguments of a call do not fit the tool's signature; the message names the argument and the fix."""


@dataclass
class Tool:
    """A callable tool: the function, its name, its schema, and an optional time limit in seconds.

    ``timeout=None`` uses the env's default (:attr:`turnrl.envs.tools.env.ToolEnv.tool_timeout`).
    """

    fn: Callable[..., Any]
    name: str
    description: str
    parameters: dict[str, Any]
    timeout: float | None = None
    hints: dict[str, Any] = field(default_factory=dict, repr=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema."""
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def signature_text(self) -> str:
        """A one-line Python-like signature for prompts: ``calculate(expression: str)``."""
        props = self.parameters["properties"]
        parts = []
        for name, prop in props.items():
            text = f"{name}: {_type_text(prop)}"
            if name not in self.parameters.get("required", []):
                text += " (optional)"
            parts.append(text)
        return f"{self.name}({', '.join(parts)})"


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, timeout: float | None = None) -> Any:
    """Turn a typed function into a :class:`Tool` (usable as ``@tool`` or ``@tool(name=..., timeout=...)``)."""

    def wrap(f: Callable[..., Any]) -> Tool:
        return make_tool(f, name=name, timeout=timeout)

    return wrap(fn) if fn is not None else wrap


def make_tool(fn: Callable[..., Any], *, name: str | None = None, timeout: float | None = None) -> Tool:
    """The :class:`Tool` for ``fn`` (bound methods work: ``self`` is not a parameter).

    Raises ``TypeError`` naming the parameter when a parameter has no type hint or an unsupported one.
    """
    if isinstance(fn, Tool):
        return fn
    tool_name = name or fn.__name__
    description, arg_docs = parse_docstring(inspect.getdoc(fn) or "")
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {tool_name}: *args/**kwargs ({pname}) cannot be described by a schema; name each parameter")
        if pname not in hints:
            raise TypeError(f"tool {tool_name}: parameter '{pname}' has no type hint; annotate it (int, float, str, bool, list[...], Literal[...])")
        prop = type_schema(hints[pname], f"tool {tool_name}, parameter '{pname}'")
        if pname in arg_docs:
            prop["description"] = arg_docs[pname]
        properties[pname] = prop
        if param.default is inspect.Parameter.empty:
            required.append(pname)
    parameters = {"type": "object", "properties": properties, "required": required}
    hints.pop("return", None)
    return Tool(fn, tool_name, description, parameters, timeout, hints)


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """``(description, {arg: description})`` from a Google-style docstring.

    The description is the text before the first section header (``Args:``, ``Returns:``, ...), joined into
    one paragraph per blank-line-separated block. Argument descriptions may continue on indented lines.
    """
    lines = doc.splitlines()
    desc_lines: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    arg_indent: int | None = None
    for line in lines:
        header = _SECTION.match(line)
        if header:
            section, current, arg_indent = header.group(1), None, None
            continue
        if section is None:
            desc_lines.append(line.strip())
        elif section in ("Args", "Arguments", "Parameters") and line.strip():
            indent = len(line) - len(line.lstrip())
            m = _ARG_LINE.match(line)
            if m and (arg_indent is None or indent <= arg_indent):
                arg_indent = indent
                current = m.group(1).lstrip("*")
                args[current] = m.group(3).strip()
            elif current is not None:
                args[current] = (args[current] + " " + line.strip()).strip()
    paragraphs = " ".join(desc_lines).strip()
    return re.sub(r"\s+", " ", paragraphs), args


def type_schema(hint: Any, where: str = "") -> dict[str, Any]:
    """The JSON schema of a type hint; ``TypeError`` (naming ``where``) for unsupported hints."""
    origin = typing.get_origin(hint)
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    if origin in (Union, types.UnionType):
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(members) == 1 and len(typing.get_args(hint)) == 2:
            schema = type_schema(members[0], where)
            schema["nullable"] = True
            return schema
        raise TypeError(f"{where}: union {hint} is not supported; use one type or Optional[X]")
    if origin is list or hint is list:
        args = typing.get_args(hint)
        return {"type": "array", "items": type_schema(args[0], where)} if args else {"type": "array"}
    if origin is Literal:
        values = list(typing.get_args(hint))
        kinds = {type(v) for v in values}
        if len(kinds) != 1 or next(iter(kinds)) not in _JSON_TYPES:
            raise TypeError(f"{where}: Literal{values} must hold values of one type among int, float, str, bool")
        return {"type": _JSON_TYPES[next(iter(kinds))], "enum": values}
    raise TypeError(f"{where}: type {hint!r} is not supported; use int, float, str, bool, list[...], Optional[...] or Literal[...]")


def validate_arguments(t: Tool, arguments: Any) -> dict[str, Any]:
    """The arguments checked against ``t``'s schema (ints converted to float where a float is expected).

    Raises :class:`ToolArgumentError` for a non-object, an unknown argument (naming the closest valid one),
    a missing required argument or a value of the wrong type.
    """
    import difflib

    if not isinstance(arguments, dict):
        raise ToolArgumentError(f"the arguments of {t.name} must be a JSON object, got {type(arguments).__name__}")
    props = t.parameters["properties"]
    out: dict[str, Any] = {}
    for key, value in arguments.items():
        if key not in props:
            close = difflib.get_close_matches(key, list(props), n=1, cutoff=0.5)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            valid = ", ".join(props) or "none"
            raise ToolArgumentError(f"{t.name} has no argument '{key}'.{hint} Its arguments: {valid}")
        out[key] = _check_value(value, props[key], f"argument '{key}' of {t.name}")
    missing = [k for k in t.parameters.get("required", []) if k not in out]
    if missing:
        raise ToolArgumentError(f"{t.name} is missing the required argument(s) {', '.join(missing)}; call it as {t.signature_text()}")
    return out


def _check_value(value: Any, schema: dict[str, Any], where: str) -> Any:
    if value is None:
        if schema.get("nullable"):
            return None
        raise ToolArgumentError(f"{where} must not be null; expected {_type_text(schema)}")
    kind = schema.get("type")
    ok = {
        "boolean": isinstance(value, bool),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "string": isinstance(value, str),
        "array": isinstance(value, list),
    }.get(kind, True)
    if not ok:
        raise ToolArgumentError(f"{where} must be {_type_text(schema)}, got {type(value).__name__} {value!r:.40}")
    if "enum" in schema and value not in schema["enum"]:
        raise ToolArgumentError(f"{where} must be one of {schema['enum']}, got {value!r:.40}")
    if kind == "number":
        return float(value)
    if kind == "array" and "items" in schema:
        return [_check_value(v, schema["items"], f"an item of {where}") for v in value]
    return value


def _type_text(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return " | ".join(repr(v) for v in schema["enum"])
    kind = schema.get("type", "any")
    text = {"integer": "int", "number": "float", "string": "str", "boolean": "bool"}.get(kind, kind)
    if kind == "array":
        text = f"list[{_type_text(schema['items'])}]" if "items" in schema else "list"
    return text + (" | None" if schema.get("nullable") else "")
