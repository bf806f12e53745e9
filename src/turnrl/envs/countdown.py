"""Countdown with a calculator tool: combine the given numbers with + - * / to reach the target.

Task (seeded). ``num_numbers`` numbers (default 4) are drawn from 1..``max_number`` (default 25; repeats are
possible), and the target is the value of a random expression over ``use`` of them (default: all), built
bottom-up with + - * / so that every intermediate value is a positive integer and the target lies in
``target_range``. So a solution always exists; the env keeps it as the gold expression. Observation::

    Numbers: 3 8 12 25
    Target: 133

Tools (see :class:`~turnrl.envs.tools.env.ToolEnv` for the call format and error handling):

- ``calculate(expression)``: the value of an arithmetic expression (a scratchpad; any numbers allowed);
- ``answer(expression)``: the final answer; ends the episode.

Expressions are parsed with :mod:`ast` and evaluated exactly over fractions, never with ``eval``: only
numeric literals, ``+ - * /``, unary minus and parentheses are accepted (at most 200 characters; a
division by zero or a value beyond 10**12 is an error message). The verifier accepts an answer that uses
only integer literals, each a given number and no given number more often than it was given (a number may
be left unused), and whose exact value equals the target. An answer that does not parse is an error
observation (the episode continues); a parsed answer that breaks a rule ends the episode with reward 0.
Reward component: ``"outcome"``, 1.0 for a correct answer, else 0.
"""

from __future__ import annotations

import ast
import random
from collections import Counter
from fractions import Fraction

from turnrl.envs.tools import Tool, ToolCall, ToolEnv, ToolError, Verdict, make_tool

MAX_EXPRESSION_CHARS = 200
MAX_MAGNITUDE = 10**12
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
# Fixed instances for the few-shot examples (not drawn from any seed): numbers, target, a solution.
_EXAMPLES = [((4, 9, 10, 2), 38, "4 * 10 - 2"), ((5, 6, 3, 7), 44, "(7 + 3) * 5 - 6")]


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """``(exact value, integer literals in order)`` of an arithmetic expression.

    Raises :class:`ToolError` with a message for the model on anything but numbers, ``+ - * /``, unary minus
    and parentheses, on division by zero and on values beyond ``MAX_MAGNITUDE``.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"the expression has {len(expression)} characters; at most {MAX_EXPRESSION_CHARS}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ToolError(f"cannot parse {expression!r}; use numbers, + - * / and parentheses") from None
    literals: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            if isinstance(node.value, int):
                literals.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div):
                if right == 0:
                    raise ToolError("division by zero")
                value = left / right
            else:
                value = {ast.Add: left + right, ast.Sub: left - right, ast.Mult: left * right}[type(node.op)]
            if abs(value) > MAX_MAGNITUDE:
                raise ToolError(f"a value exceeds {MAX_MAGNITUDE:.0e}")
            return value
        what = type(node.op).__name__ if isinstance(node, (ast.BinOp, ast.UnaryOp)) else type(node).__name__
        raise ToolError(f"{what} is not allowed; use numbers, + - * / and parentheses")

    return walk(tree.body), literals


def format_value(value: Fraction) -> str:
    """``42``, or ``7/3 (= 2.3333)`` for a non-integer."""
    return str(value.numerator) if value.denominator == 1 else f"{value} (= {float(value):.4f})"


def check_answer(expression: str, numbers: tuple[int, ...], target: int) -> tuple[bool, str]:
    """``(correct, message)`` for a final answer (see the module docstring). :class:`ToolError` if it does not parse."""
    value, literals = evaluate(expression)
    if not literals:
        return False, "The answer uses none of the numbers."
    extra = Counter(literals) - Counter(numbers)
    if extra:
        bad = ", ".join(str(n) for n in sorted(extra.elements()))
        return False, f"The answer uses {bad}, more often than given (numbers: {' '.join(map(str, numbers))})."
    tree = ast.parse(expression.strip(), mode="eval")
    if any(isinstance(n, ast.Constant) and isinstance(n.value, float) for n in ast.walk(tree)):
        return False, "The answer may only use the given whole numbers."
    if value != target:
        return False, f"The answer equals {format_value(value)}, not {target}."
    return True, f"Correct: {expression.strip()} = {target}."


def random_task(rng: random.Random, num_numbers: int, max_number: int, use: int, target_range: tuple[int, int]) -> tuple[tuple[int, ...], int, str]:
    """``(numbers, target, gold expression)``: the target is reachable by construction (see the module docstring)."""
    lo, hi = target_range
    while True:
        numbers = [rng.randint(1, max_number) for _ in range(num_numbers)]
        picked = rng.sample(range(num_numbers), use)
        terms: list[tuple[int, str]] = [(numbers[i], str(numbers[i])) for i in picked]
        while len(terms) > 1:
            a, b = terms.pop(rng.randrange(len(terms))), terms.pop(rng.randrange(len(terms)))
            if a[0] < b[0]:
                a, b = b, a
            options = [(a[0] + b[0], f"{a[1]} + {b[1]}", True), (a[0] * b[0], f"{_wrap(a[1])} * {_wrap(b[1])}", True)]
            if a[0] > b[0]:
                options.append((a[0] - b[0], f"{a[1]} - {_wrap(b[1])}", True))
            if b[0] > 1 and a[0] % b[0] == 0:
                options.append((a[0] // b[0], f"{_wrap(a[1])} / {_wrap(b[1], strict=True)}", True))
            value, text, _ = rng.choice(options)
            terms.append((value, f"({text})"))
        target, expr = terms[0]
        if lo <= target <= hi:
            return tuple(numbers), target, _strip_outer(expr)


def _wrap(text: str, strict: bool = False) -> str:
    return text if text.startswith("(") or text.isdigit() or not strict else f"({text})"


def _strip_outer(text: str) -> str:
    return text[1:-1] if text.startswith("(") and text.endswith(")") else text


class Countdown(ToolEnv):
    """Reach the target from the given numbers with + - * / (see the module docstring).

    Args:
        num_numbers: how many numbers are given (2-6).
        max_number: numbers are drawn from 1..max_number.
        use: how many of them the constructed solution uses (default: all).
        target_range: (low, high) bounds of the target.
        max_actions_per_turn, tool_timeout: see :class:`~turnrl.envs.tools.env.ToolEnv`.
    """

    task_description = (
        "You play Countdown. Combine some of the given numbers with + - * / and parentheses to reach the target. "
        "Use each given number at most once. Check arithmetic with calculate, then give the expression with answer."
    )
    final_tools = ("answer",)
    reward_names = ("outcome",)

    def __init__(self, num_numbers: int = 4, max_number: int = 25, use: int | None = None,
                 target_range: tuple[int, int] = (10, 200), max_actions_per_turn: int = 1, tool_timeout: float = 2.0) -> None:
        if not 2 <= num_numbers <= 6:
            raise ValueError(f"num_numbers={num_numbers} must be between 2 and 6")
        if max_number < 2:
            raise ValueError(f"max_number={max_number} must be >= 2")
        use = num_numbers if use is None else use
        if not 2 <= use <= num_numbers:
            raise ValueError(f"use={use} must be between 2 and num_numbers={num_numbers}")
        if not 1 <= target_range[0] <= target_range[1]:
            raise ValueError(f"target_range={target_range} must be (low, high) with 1 <= low <= high")
        self.num_numbers, self.max_number, self.use, self.target_range = num_numbers, max_number, use, tuple(target_range)
        self._rng = random.Random()
        self.numbers: tuple[int, ...] = ()
        self.target = 0
        self.gold = ""
        super().__init__(max_actions_per_turn=max_actions_per_turn, tool_timeout=tool_timeout)

    def build_tools(self) -> list[Tool]:
        def calculate(expression: str) -> str:
            """Evaluate an arithmetic expression exactly.

            Args:
                expression: numbers with + - * / and parentheses, e.g. "(25 - 3) * 4".
            """
            return format_value(evaluate(expression)[0])

        def answer(expression: str) -> str:
            """Submit the final expression; it must equal the target and use each given number at most once.

            Args:
                expression: the solution, e.g. "(25 - 3) * 4".
            """
            raise AssertionError("answer is judged by verify()")  # never called: final tools go to verify

        return [make_tool(calculate), make_tool(answer)]

    def new_task(self, seed: int | None) -> None:
        if seed is not None:
            self._rng = random.Random(seed)
        self.numbers, self.target, self.gold = random_task(self._rng, self.num_numbers, self.max_number, self.use, self.target_range)

    def task_observation(self) -> str:
        return _observation(self.numbers, self.target)

    def task_key(self) -> str:
        """The numbers (sorted: their order does not change the puzzle) and the target: ``"3 8 12 25 -> 133"``."""
        return f"{' '.join(map(str, sorted(self.numbers)))} -> {self.target}"

    def verify(self, call: ToolCall) -> Verdict:
        correct, message = check_answer(call.arguments["expression"], self.numbers, self.target)
        return Verdict({"outcome": 1.0 if correct else 0.0}, correct, message)

    def oracle_calls(self) -> list[ToolCall]:
        """The answer call with the constructed expression."""
        return [ToolCall("answer", {"expression": self.gold})]

    def examples(self) -> list[tuple[str, str]]:
        """Two fixed instances answered directly."""
        out = []
        for numbers, target, expr in _EXAMPLES:
            assert check_answer(expr, numbers, target)[0], "few-shot examples must be correct"
            out.append((_observation(numbers, target), ToolCall("answer", {"expression": expr}).to_text()))
        return out

    def render(self) -> str:
        lines = [_observation(self.numbers, self.target)]
        lines += [f"called {s}" for s in self.history]
        if self.last_verdict is not None:
            lines.append(self.last_verdict.message)
        return "\n".join(lines)


def _observation(numbers: tuple[int, ...], target: int) -> str:
    return f"Numbers: {' '.join(map(str, numbers))}\nTarget: {target}"
