"""The tool-use layer: typed functions as tools (``schema``), tool calls in model text (``calls``), and
:class:`ToolEnv`, the base class of tool-using environments (``env``). Built on it: ``countdown-v0``,
``searchqa-v0`` and ``sql-v0`` (see docs/envs.md, "Writing a tool env")."""

from turnrl.envs.tools.calls import ParsedCalls, ToolCall, parse_tool_calls
from turnrl.envs.tools.env import CALL_FORMAT, ToolEnv, ToolTimeout, Verdict, run_with_timeout
from turnrl.envs.tools.schema import Tool, ToolArgumentError, ToolError, make_tool, parse_docstring, tool, type_schema, validate_arguments

__all__ = [
    "CALL_FORMAT", "ParsedCalls", "Tool", "ToolArgumentError", "ToolCall", "ToolEnv", "ToolError", "ToolTimeout",
    "Verdict", "make_tool", "parse_docstring", "parse_tool_calls", "run_with_timeout", "tool", "type_schema",
    "validate_arguments",
]
