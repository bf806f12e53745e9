"""``ToolEnv``: an :class:`~turnrl.envs.base.Env` whose actions are tool calls (verifiers' ``ToolEnv``, for turnrl).

A subclass supplies the task and the tools; the base class does the rest:

- **Prompt.** ``instructions`` (set per instance) is the subclass's ``task_description`` followed by the
  tools (one signature line and description each, with argument descriptions) and the call format. SmolLM2's
  chat template has no ``tools=`` support, so the tools live in the system prompt text; :meth:`tool_schemas`
  gives the OpenAI-style schemas for a template that does support them.
- **Turns.** ``step`` parses up to ``max_actions_per_turn`` calls (:func:`~turnrl.envs.tools.calls.parse_tool_calls`)
  and runs them in order. Each call's result, or its error, comes back in the observation as
  ``<tool_response name="...">...</tool_response>``. Errors are observations, never exceptions: malformed
  JSON, no call at all, an unknown tool (the message names the closest tool), missing/unknown/mistyped
  arguments, a :class:`~turnrl.envs.tools.schema.ToolError` or any other exception raised by the tool, and a tool
  that outlives its time limit. A turn with any such error has ``info["valid"] = False``; calls that ran
  are still listed in ``info["actions"]`` (as :meth:`ToolCall.signature` strings) and keep their effect.
- **Ending.** Calling a tool named in ``final_tools`` (e.g. ``answer``) makes the env call
  :meth:`verify`, which returns a :class:`Verdict`; the episode terminates with the verdict's reward
  components (their sum is the reward) and ``success``. Calls after the final one in the same response are
  ignored. A verifier may raise :class:`ToolError` (e.g. an answer that does not parse): that is an error
  observation and the episode goes on. Non-final turns pay 0 in every component of ``reward_names``.
- **State.** The anchor is the task key plus the signatures of the calls that ran, in order: invalid text
  leaves it unchanged. The oracle (:meth:`solve`) is the subclass's :meth:`oracle_calls` minus the calls that
  already ran, each rendered as a ``<tool_call>`` response (one call per turn).

Time limits: each tool runs in a worker thread joined with ``tool.timeout`` (else ``tool_timeout``) seconds.
Python cannot kill a thread, so a timed-out call keeps running in the background until it returns; the env
answers at once and ignores its result. Tools that can loop for long must stop themselves as well
(``sql-v0`` aborts SQLite with a progress handler); tools must not mutate env state they share with later calls
in a way a late finish would corrupt.
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from turnrl.envs.base import Env
from turnrl.envs.tools.calls import ToolCall, parse_tool_calls
from turnrl.envs.tools.schema import Tool, ToolArgumentError, ToolError, make_tool, validate_arguments

CALL_FORMAT = (
    'Call a tool by writing <tool_call>{"name": "TOOL", "arguments": {...}}</tool_call>. '
    "The results come back in the next message."
)


@dataclass
class Verdict:
    """The verifier's judgement of a final call: named reward components (summing to the reward), success,
    and a message for the model."""

    components: dict[str, float]
    success: bool
    message: str

    @property
    def reward(self) -> float:
        return float(sum(self.components.values()))


class ToolTimeout(ToolError):
    """A tool ran longer than its time limit."""


def run_with_timeout(fn: Callable[..., Any], kwargs: dict[str, Any], timeout: float | None) -> Any:
    """``fn(**kwargs)`` in a daemon thread; :class:`ToolTimeout` if it has not returned after ``timeout`` s.

    Exceptions of ``fn`` are re-raised here. ``timeout=None`` runs ``fn`` inline without a limit.
    """
    if timeout is None:
        return fn(**kwargs)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn(**kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = e

    worker = threading.Thread(target=target, daemon=True, name="turnrl-tool")
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise ToolTimeout(f"stopped after {timeout:g} s (time limit)")
    if "error" in box:
        raise box["error"]
    return box.get("result")


class ToolEnv(Env):
    """Base class of tool-using envs (see the module docstring).

    Subclasses implement :meth:`build_tools`, :meth:`new_task`, :meth:`task_observation`, :meth:`task_key`,
    :meth:`verify` and :meth:`oracle_calls`, and set ``task_description``, ``final_tools`` and ``reward_names``.
    ``build_tools`` runs inside ``ToolEnv.__init__``: set what it needs before calling ``super().__init__()``.
    Tools run synchronously (``astep`` is the base class's), so a slow tool holds up an asyncio collector for
    up to its time limit.

    Args:
        max_actions_per_turn: how many calls one response may carry; extra ones are ignored (and said so).
        tool_timeout: default time limit of a call, in seconds (a tool's own ``timeout`` overrides it).
        max_result_chars: a tool result longer than this is cut, with a note saying so.
    """

    task_description: ClassVar[str] = ""
    final_tools: ClassVar[tuple[str, ...]] = ("answer",)
    reward_names: ClassVar[tuple[str, ...]] = ("outcome",)

    def __init__(self, max_actions_per_turn: int = 1, tool_timeout: float = 5.0, max_result_chars: int = 1500) -> None:
        if max_actions_per_turn < 1:
            raise ValueError(f"max_actions_per_turn={max_actions_per_turn} must be >= 1")
        if tool_timeout <= 0:
            raise ValueError(f"tool_timeout={tool_timeout} must be > 0 seconds")
        self.max_actions_per_turn, self.tool_timeout, self.max_result_chars = max_actions_per_turn, tool_timeout, max_result_chars
        self.tools: dict[str, Tool] = {}
        for t in self.build_tools():
            t = make_tool(t)
            if t.name in self.tools:
                raise ValueError(f"two tools are named {t.name!r}; tool names must be unique")
            self.tools[t.name] = t
        missing = [n for n in self.final_tools if n not in self.tools]
        if missing:
            raise ValueError(f"final_tools {missing} are not among the tools {list(self.tools)}; build_tools() must return them")
        self.instructions = self.render_instructions()  # type: ignore[misc]  # per instance: depends on the tools
        self.history: list[str] = []
        self.done = False
        self.last_verdict: Verdict | None = None

    # ---- what a subclass provides -------------------------------------------------------------------------
    def build_tools(self) -> list[Tool | Callable[..., Any]]:
        """The tools (typed functions or :class:`Tool` objects; bound methods may read the current task)."""
        raise NotImplementedError

    def new_task(self, seed: int | None) -> None:
        """Build the task for ``seed`` (``None``: continue the env's RNG)."""
        raise NotImplementedError

    def task_observation(self) -> str:
        """The first observation: the task as the model sees it."""
        raise NotImplementedError

    def task_key(self) -> str:
        """What makes two tasks the same (the :class:`~turnrl.envs.base.Env` contract); also the first part of the anchor."""
        raise NotImplementedError

    def verify(self, call: ToolCall) -> Verdict:
        """Judge the final call ``call`` (already validated). May raise :class:`ToolError` for an unusable answer."""
        raise NotImplementedError

    def oracle_calls(self) -> list[ToolCall]:
        """A gold call sequence from the start of the task that earns full reward; the last call is final."""
        raise NotImplementedError

    # ---- the Env contract ---------------------------------------------------------------------------------
    def render_instructions(self) -> str:
        """``task_description``, the tools, and the call format (the system prompt)."""
        lines = [self.task_description.strip(), "", "Tools:"]
        for t in self.tools.values():
            final = " Ends the episode." if t.name in self.final_tools else ""
            lines.append(f"- {t.signature_text()}: {t.description}{final}")
            for pname, prop in t.parameters["properties"].items():
                if prop.get("description"):
                    lines.append(f"    {pname}: {prop['description']}")
        lines += ["", CALL_FORMAT]
        return "\n".join(lines)

    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI-style schemas of the tools, for chat templates with ``tools=`` support."""
        return [t.schema for t in self.tools.values()]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """A new task for ``seed``; ``info["task"]`` holds the task key."""
        self.new_task(seed)
        self.history, self.done, self.last_verdict = [], False, None
        return self.task_observation(), {"task": self.task_key()}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Run the calls in ``action_text`` (see the module docstring). ``RuntimeError`` after termination."""
        if self.done:
            raise RuntimeError("step() after the episode terminated; call reset() first")
        parsed = parse_tool_calls(action_text, self.max_actions_per_turn)
        responses: list[str] = [_response("error", e) for e in parsed.errors]
        valid = not parsed.errors
        executed: list[str] = []
        verdict: Verdict | None = None
        if not parsed.calls and not parsed.errors:
            responses.append(_response("error", f"No tool call found. {CALL_FORMAT} Tools: {', '.join(self.tools)}."))
            valid = False
        for call in parsed.calls:
            ok, text, verdict = self._execute(call)
            responses.append(_response(call.name if call.name in self.tools else "error", text))
            valid &= ok
            if ok:
                executed.append(call.signature())
                self.history.append(call.signature())
            if verdict is not None:
                break
        if parsed.dropped and verdict is None:
            responses.append(_response("note", f"{parsed.dropped} more call(s) ignored: at most {self.max_actions_per_turn} per turn."))
        components = {name: 0.0 for name in self.reward_names}
        success = False
        if verdict is not None:
            self.done, self.last_verdict = True, verdict
            components, success = dict(verdict.components), verdict.success
        info = {"actions": executed, "valid": valid, "success": success, "reward_components": components}
        return "\n".join(responses), float(sum(components.values())), self.done, False, info

    def _execute(self, call: ToolCall) -> tuple[bool, str, Verdict | None]:
        """``(ok, result or error text, verdict if the call was final and judged)``."""
        t = self.tools.get(call.name)
        if t is None:
            close = difflib.get_close_matches(call.name, list(self.tools), n=1, cutoff=0.0)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            return False, f"Unknown tool '{call.name}'.{hint} Tools: {', '.join(self.tools)}.", None
        try:
            args = validate_arguments(t, call.arguments)
        except ToolArgumentError as e:
            return False, f"Error: {e}", None
        canonical = ToolCall(call.name, args)
        try:
            if t.name in self.final_tools:
                verdict = run_with_timeout(lambda: self.verify(canonical), {}, t.timeout or self.tool_timeout)
                return True, verdict.message, verdict
            result = run_with_timeout(t.fn, args, t.timeout or self.tool_timeout)
        except ToolTimeout as e:
            return False, f"Error: {t.name} {e}.", None
        except ToolError as e:
            return False, f"Error: {e}", None
        except Exception as e:  # noqa: BLE001 - a tool bug is reported to the model, not raised
            return False, f"Error: {t.name} raised {type(e).__name__}: {e}", None
        text = result if isinstance(result, str) else repr(result)
        if len(text) > self.max_result_chars:
            text = text[: self.max_result_chars] + f"\n[cut at {self.max_result_chars} characters]"
        return True, text, None

    def anchor(self) -> str:
        """The task key, then the calls that ran (``|``-separated)."""
        return " | ".join([self.task_key(), *self.history])

    def solve(self) -> list[str] | None:
        """The oracle's calls that have not run yet, one ``<tool_call>`` response per turn; [] when done."""
        if self.done:
            return [] if self.last_verdict is not None and self.last_verdict.success else None
        ran = set(self.history)
        return [c.to_text() for c in self.oracle_calls() if c.signature() not in ran or c.name in self.final_tools]


def _response(name: str, text: str) -> str:
    return f'<tool_response name="{name}">\n{text}\n</tool_response>'
