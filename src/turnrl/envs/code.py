"""Code: write a small Python function; hidden unit tests, run in the sandbox, score it.

Each seed draws one task from a bank of templates (``TEMPLATES``: 24 function-writing problems such as
clamping a list, a Caesar shift, counting pairs with a target sum, run-length encoding; ``max_lines``, the difficulty,
keeps those whose gold program has at most that many non-blank lines, 2 to 10), with seeded
parameters (the bounds, the shift, the target, ...; every template draws some, 8 to 99 distinct programs each,
so a held-out set keyed by program leaves every template drawable in training) and seeded test inputs.
The observation states the function's name, signature and behaviour, with the first ``num_visible`` tests as examples. The model
answers with the function in a fenced code block (```` ```python ````; the last fenced block of the response
counts). The submission and a test harness run in :func:`turnrl.envs.sandbox.run_python` (no network, no host
files, CPU/memory/wall limits); each of the ``num_tests`` hidden tests calls the function on its inputs,
and the returned value must equal the gold solution's (as JSON; floats within 1e-6).

Multi-turn. After a submission that fails some test, the observation reports the score, each failed
*visible* test with the expected and the returned value (or the exception), how many hidden tests failed,
and any error (a syntax error, a missing function, a limit that killed the program), and the agent may
submit again until the turn limit. Passing every test terminates with success.

Reward. Component ``"tests"`` is the change in the fraction of hidden tests the latest submission passes,
so an episode's return is the fraction passed by its last submission (a regression costs reward; a turn
without a code block changes nothing and is invalid). ``info`` carries ``tests_passed``/``tests_total``.

The gold solutions compute the expected values in this process (trusted code); only the model's code
runs in the sandbox, so printing fake results cannot help it: the harness reports return values and
the comparison with the hidden expected values happens outside the sandbox.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import math
import os
import random
import re
import string
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from turnrl.envs.base import Env
from turnrl.envs.sandbox import Limits, SandboxResult, check_isolation, run_python

_RESULT_MARK = "@@turnrl-result@@"
# A fence, an optional language tag, then the code: on the next line, or on the same line (```python x = 1```).
_CODE_BLOCK = re.compile(r"```(?:[ \t]*(?:python3|python|py)(?=\s))?[ \t]*\n?(.*?)(?:```|\Z)", re.IGNORECASE | re.DOTALL)
_ANSWER_HINT = "Answer with the complete function in a ```python code block."
# At most this many sandboxed test runs at once in this process (the collector steps many episodes together).
_RUN_SLOTS = threading.BoundedSemaphore(max(1, os.cpu_count() or 1))


@dataclass(frozen=True)
class CodeTask:
    """One function-writing problem: what to write, the gold solution, and the test inputs."""

    template: str
    name: str
    """The function's name."""
    signature: str
    """``def name(args) -> type``, as shown to the model."""
    description: str
    solution: str
    """Gold source defining ``name``."""
    inputs: tuple[tuple[Any, ...], ...]
    """Argument tuples of the hidden tests; the first ``num_visible`` are shown as examples."""
    expected: tuple[Any, ...]
    """The gold solution's return value for each input (JSON-normalised)."""

    def call(self, args: tuple[Any, ...]) -> str:
        return f"{self.name}({', '.join(repr(a) for a in args)})"


# ------------------------------------------------------------------------------------------------ templates
# Each template draws its parameters and test inputs from the rng and returns
# (name, signature, description, gold source, inputs). The gold source is the only oracle.

Template = Callable[[random.Random], tuple[str, str, str, str, list[tuple[Any, ...]]]]
TEMPLATES: dict[str, Template] = {}


def _template(fn: Template) -> Template:
    TEMPLATES[fn.__name__.lstrip("_")] = fn
    return fn


def _ints(rng: random.Random, lo: int = -20, hi: int = 20, n: tuple[int, int] = (0, 8)) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(*n))]


def _word(rng: random.Random, n: tuple[int, int] = (1, 7), letters: str = string.ascii_lowercase) -> str:
    return "".join(rng.choice(letters) for _ in range(rng.randint(*n)))


@_template
def _clamp_list(rng):
    lo = rng.randint(-10, 0)
    hi = rng.randint(1, 10)
    src = f"def clamp_list(xs):\n    return [min(max(x, {lo}), {hi}) for x in xs]\n"
    return ("clamp_list", "def clamp_list(xs: list[int]) -> list[int]",
            f"Return a new list with every element of xs clamped to the range [{lo}, {hi}].", src,
            [(_ints(rng),) for _ in range(8)])


@_template
def _count_multiples(rng):
    k = rng.randint(2, 9)
    op, words = rng.choice([("==", "divisible"), ("!=", "not divisible")])
    src = f"def count_multiples(xs):\n    return sum(1 for x in xs if x % {k} {op} 0)\n"
    return ("count_multiples", "def count_multiples(xs: list[int]) -> int",
            f"Return how many elements of xs are {words} by {k} (0 is divisible by every number).", src,
            [(_ints(rng, -30, 30, (0, 10)),) for _ in range(8)])


@_template
def _rotate_left(rng):
    k = rng.randint(1, 12)
    src = f"def rotate_left(xs):\n    if not xs:\n        return []\n    k = {k} % len(xs)\n    return xs[k:] + xs[:k]\n"
    return ("rotate_left", "def rotate_left(xs: list[int]) -> list[int]",
            f"Return xs rotated left by {k} positions (the first element moves to the end, {k} times); "
            "an empty list stays empty.", src, [(_ints(rng, 0, 9, (0, 7)),) for _ in range(8)])


@_template
def _caesar(rng):
    k = rng.randint(1, 25)
    src = (f"def caesar(s):\n    out = []\n    for ch in s:\n        if 'a' <= ch <= 'z':\n"
           f"            out.append(chr((ord(ch) - 97 + {k}) % 26 + 97))\n        else:\n            out.append(ch)\n"
           "    return ''.join(out)\n")
    letters = string.ascii_lowercase + " .!AZ"
    return ("caesar", "def caesar(s: str) -> str",
            f"Shift every lower-case letter a-z of s forward by {k} places in the alphabet, wrapping from z to a; "
            "leave every other character unchanged.", src, [(_word(rng, (0, 10), letters),) for _ in range(8)])


@_template
def _every_nth(rng):
    k = rng.randint(2, 4)
    start = rng.randint(0, 2)
    src = f"def every_nth(xs):\n    return xs[{start}::{k}]\n"
    return ("every_nth", "def every_nth(xs: list[int]) -> list[int]",
            f"Return the elements of xs at indices {start}, {start + k}, {start + 2 * k}, ... in order.", src,
            [(_ints(rng, 0, 50, (0, 10)),) for _ in range(8)])


@_template
def _running_max(rng):
    floor = rng.randint(-10, 10)
    src = (f"def running_max(xs):\n    out = []\n    for x in xs:\n        out.append(max(out[-1] if out else {floor}, x))\n"
           "    return out\n")
    return ("running_max", "def running_max(xs: list[int]) -> list[int]",
            f"Return a list whose i-th element is the largest of {floor}, xs[0], ..., xs[i].", src,
            [(_ints(rng),) for _ in range(8)])


@_template
def _count_char(rng):
    c = rng.choice("aeiou")
    fold = rng.random() < 0.5
    src = f"def count_char(s):\n    return s{'.lower()' if fold else ''}.count({c!r})\n"
    how = f"{c!r} or {c.upper()!r}" if fold else f"lower-case {c!r} (not {c.upper()!r})"
    return ("count_char", "def count_char(s: str) -> int", f"Return how many characters of s are {how}.", src,
            [(_word(rng, (0, 12), "aeiouxyAEIOU "),) for _ in range(8)])


@_template
def _fizz_word(rng):
    a, b = rng.sample([2, 3, 4, 5, 7], 2)
    w1, w2 = rng.choice(["Fizz", "Ping", "Foo"]), rng.choice(["Buzz", "Pong", "Bar"])
    src = (f"def fizz_word(n):\n    word = ''\n    if n % {a} == 0:\n        word += {w1!r}\n"
           f"    if n % {b} == 0:\n        word += {w2!r}\n    return word or str(n)\n")
    return ("fizz_word", "def fizz_word(n: int) -> str",
            f"Return {w1!r} if n is divisible by {a}, {w2!r} if by {b}, {w1 + w2!r} if by both, else str(n).", src,
            [(n,) for n in rng.sample(range(1, 60), 8)])


@_template
def _digit_sum_base(rng):
    b = rng.randint(2, 16)
    src = f"def digit_sum_base(n):\n    total = 0\n    while n:\n        total += n % {b}\n        n //= {b}\n    return total\n"
    return ("digit_sum_base", "def digit_sum_base(n: int) -> int",
            f"Return the sum of the digits of the non-negative integer n written in base {b}.", src,
            [(n,) for n in [0] + rng.sample(range(1, 5000), 7)])


@_template
def _pairs_with_sum(rng):
    t = rng.randint(-5, 10)
    src = (f"def pairs_with_sum(xs):\n    n = 0\n    for i in range(len(xs)):\n        for j in range(i + 1, len(xs)):\n"
           f"            if xs[i] + xs[j] == {t}:\n                n += 1\n    return n\n")
    return ("pairs_with_sum", "def pairs_with_sum(xs: list[int]) -> int",
            f"Return the number of index pairs i < j with xs[i] + xs[j] == {t}.", src,
            [(_ints(rng, -5, 10, (0, 9)),) for _ in range(8)])


@_template
def _longest_run(rng):
    t = rng.randint(-5, 5)
    src = ("def longest_run(xs):\n    best = cur = 0\n    for x in xs:\n"
           f"        cur = cur + 1 if x > {t} else 0\n        best = max(best, cur)\n    return best\n")
    return ("longest_run", "def longest_run(xs: list[int]) -> int",
            f"Return the length of the longest run of consecutive elements of xs that are all greater than {t} "
            "(0 if there is none).", src, [(_ints(rng, -9, 9, (0, 10)),) for _ in range(8)])


@_template
def _dedupe(rng):
    lo = rng.randint(-5, 3)
    src = ("def dedupe(xs):\n    seen, out = set(), []\n    for x in xs:\n"
           f"        if x >= {lo} and x not in seen:\n            seen.add(x)\n            out.append(x)\n    return out\n")
    return ("dedupe", "def dedupe(xs: list[int]) -> list[int]",
            f"Return the elements of xs that are at least {lo}, without repeated values, keeping the first occurrence "
            "of each, in order.", src, [(_ints(rng, -6, 6, (0, 10)),) for _ in range(8)])


@_template
def _top_k(rng):
    k = rng.randint(1, 5)
    largest = rng.random() < 0.5
    src = f"def top_k(xs):\n    return sorted(xs{', reverse=True' if largest else ''})[:{k}]\n"
    which, order = ("largest", "descending") if largest else ("smallest", "ascending")
    return ("top_k", "def top_k(xs: list[int]) -> list[int]",
            f"Return the {k} {which} elements of xs in {order} order (all of them if xs has fewer; "
            "repeated values count separately).", src, [(_ints(rng, -9, 9, (0, 8)),) for _ in range(8)])


@_template
def _long_words(rng):
    m = rng.randint(2, 6)
    op, words = rng.choice([(">=", "at least"), ("<=", "at most")])
    src = f"def long_words(s):\n    return [w for w in s.split() if len(w) {op} {m}]\n"
    return ("long_words", "def long_words(s: str) -> list[str]",
            f"Split s on whitespace and return the words with {words} {m} characters, in order.", src,
            [(" ".join(_word(rng, (1, 7)) for _ in range(rng.randint(0, 6))),) for _ in range(8)])


@_template
def _collatz_steps(rng):
    t = rng.randint(1, 10)
    src = (f"def collatz_steps(n):\n    steps = 0\n    while n > {t}:\n        n = n // 2 if n % 2 == 0 else 3 * n + 1\n"
           "        steps += 1\n    return steps\n")
    return ("collatz_steps", "def collatz_steps(n: int) -> int",
            f"For n >= 1, return how many steps of the Collatz map (n // 2 if n is even, else 3 * n + 1) it takes to "
            f"reach a value of at most {t} (0 if n is already at most {t}).", src,
            [(n,) for n in [1, t + 1] + rng.sample(range(2, 200), 6)])


@_template
def _poly(rng):
    coeffs = [rng.randint(-4, 4) for _ in range(rng.randint(2, 4))]
    terms = " + ".join(f"{c}*x**{i}" for i, c in enumerate(coeffs))
    src = f"def poly(x):\n    return sum(c * x ** i for i, c in enumerate({coeffs}))\n"
    return ("poly", "def poly(x: int) -> int", f"Return {terms}.", src, [(x,) for x in rng.sample(range(-10, 11), 8)])


@_template
def _chunk(rng):
    k = rng.randint(2, 6)
    keep = rng.random() < 0.5
    src = f"def chunk(xs):\n    return [xs[i:i + {k}] for i in range(0, len(xs){'' if keep else f' - {k} + 1'}, {k})]\n"
    last = "the last one may be shorter" if keep else "a shorter last chunk is dropped"
    return ("chunk", "def chunk(xs: list[int]) -> list[list[int]]",
            f"Split xs into consecutive chunks of {k} elements ({last}); [] for an empty list.", src,
            [(_ints(rng, 0, 9, (0, 12)),) for _ in range(8)])


@_template
def _replace_vowels(rng):
    c = rng.choice("*#_-.+=~")
    src = f"def replace_vowels(s):\n    return ''.join({c!r} if ch in 'aeiouAEIOU' else ch for ch in s)\n"
    return ("replace_vowels", "def replace_vowels(s: str) -> str",
            f"Return s with every vowel (a, e, i, o, u, either case) replaced by {c!r}.", src,
            [(_word(rng, (0, 10), "abeiouxyzAEO "),) for _ in range(8)])


@_template
def _second_largest(rng):
    missing = None if rng.random() < 0.25 else rng.randint(-9, 9)
    src = ("def second_largest(xs):\n    values = sorted(set(xs), reverse=True)\n"
           f"    return values[1] if len(values) > 1 else {missing}\n")
    returns = "int | None" if missing is None else "int"
    return ("second_largest", f"def second_largest(xs: list[int]) -> {returns}",
            f"Return the second largest distinct value of xs, or {missing} if xs has fewer than two distinct values.",
            src, [(_ints(rng, 0, 6, (0, 6)),) for _ in range(8)])


@_template
def _balanced(rng):
    kinds = ["()", "[]", "{}", "<>"]
    pairs = "".join(p for p in kinds if p in rng.sample(kinds, rng.randint(1, 3)))
    opens, closes = pairs[0::2], pairs[1::2]
    src = (f"def balanced(s):\n    stack = []\n    for ch in s:\n        if ch in {opens!r}:\n            stack.append(ch)\n"
           f"        elif ch in {closes!r}:\n            if not stack or {opens!r}[{closes!r}.index(ch)] != stack.pop():\n"
           "                return False\n    return not stack\n")
    return ("balanced", "def balanced(s: str) -> bool",
            f"Return True if the brackets {' '.join(pairs)} in s are balanced and properly nested; other characters "
            "are ignored.", src, [(_word(rng, (0, 8), pairs + "x"),) for _ in range(8)])


@_template
def _interleave(rng):
    k = rng.randint(1, 4)
    first, second = rng.choice([("a", "b"), ("b", "a")])
    src = (f"def interleave(a, b):\n    out = []\n    for i in range(0, max(len(a), len(b)), {k}):\n"
           f"        out += {first}[i:i + {k}]\n        out += {second}[i:i + {k}]\n    return out\n")
    order = (f"{first}[0], {second}[0], {first}[1], {second}[1], ..." if k == 1 else
             f"the first {k} elements of {first}, then the first {k} of {second}, then the next {k} of {first}, and so on")
    return ("interleave", "def interleave(a: list[int], b: list[int]) -> list[int]",
            f"Return {order}; when one list runs out, the rest of the other follows.", src,
            [(_ints(rng, 0, 9, (0, 6)), _ints(rng, 10, 19, (0, 6))) for _ in range(8)])


@_template
def _gcd_list(rng):
    start = rng.choice([0, 12, 18, 20, 24, 30, 36, 40, 42, 48, 60])
    src = f"import math\n\ndef gcd_list(xs):\n    g = {start}\n    for x in xs:\n        g = math.gcd(g, x)\n    return g\n"
    what = ("the positive integers in xs (0 for an empty list)" if start == 0 else
            f"{start} and the positive integers in xs ({start} for an empty list)")
    k = rng.randint(2, 6)
    return ("gcd_list", "def gcd_list(xs: list[int]) -> int", f"Return the greatest common divisor of {what}.", src,
            [([k * rng.randint(1, 12) for _ in range(rng.randint(0, 5))],) for _ in range(8)])


@_template
def _run_length(rng):
    sep = rng.choice(["", ":", "-", "="])
    count_first = rng.random() < 0.5
    piece = "str(j - i) + {sep!r} + s[i]" if count_first else "s[i] + {sep!r} + str(j - i)"
    src = (f"def run_length(s):\n    out = []\n    i = 0\n    while i < len(s):\n        j = i\n"
           f"        while j < len(s) and s[j] == s[i]:\n            j += 1\n        out.append({piece.format(sep=sep)})\n"
           "        i = j\n    return ''.join(out)\n")
    parts, example = ((f"the run length, {sep!r} and the character", f"3{sep}a1{sep}b") if count_first else
                      (f"the character, {sep!r} and the run length", f"a{sep}3b{sep}1"))
    return ("run_length", "def run_length(s: str) -> str",
            f"Run-length encode s: each maximal run of one character becomes {parts} "
            f"(so 'aaab' -> {example!r}).", src, [(_word(rng, (0, 9), "aab"),) for _ in range(8)])


@_template
def _mean_above(rng):
    t = rng.randint(-5, 8)
    src = f"def mean_above(xs):\n    vals = [x for x in xs if x > {t}]\n    return sum(vals) / len(vals) if vals else 0.0\n"
    return ("mean_above", "def mean_above(xs: list[int]) -> float",
            f"Return the mean of the elements of xs greater than {t}, or 0.0 if there are none.", src,
            [(_ints(rng, -10, 15, (0, 7)),) for _ in range(8)])


def make_task(rng: random.Random, template: str, num_tests: int) -> CodeTask:
    """Draw ``template``'s parameters and inputs from ``rng``; expected values from its gold solution."""
    name, signature, description, solution, inputs = TEMPLATES[template](rng)
    namespace: dict[str, Any] = {}
    exec(compile(solution, f"<gold {template}>", "exec"), namespace)  # noqa: S102 - our own trusted gold source
    inputs = inputs[:num_tests]
    expected = tuple(json.loads(json.dumps(namespace[name](*args))) for args in inputs)
    return CodeTask(template, name, signature, description, solution, tuple(tuple(a) for a in inputs), expected)


@functools.cache
def program_lines(template: str) -> int:
    """Non-blank lines of ``template``'s gold program (the same for every draw of its parameters)."""
    return sum(1 for line in make_task(random.Random(0), template, 1).solution.splitlines() if line.strip())


def extract_code(text: str) -> str | None:
    """The body of the last fenced code block (```python, ```py or bare ```) in ``text``; None if there is none.

    A block cut off by the token limit (no closing fence) still counts, and so does a one-line block
    (```` ```python def f(x): return x``` ````, what a person can type in ``turnrl play``).
    """
    blocks = _CODE_BLOCK.findall(text)
    return blocks[-1] if blocks else None


def _harness(name: str) -> str:
    """Sandbox main program: import the submission, call it on each test input, print one JSON line per test."""
    return f"""import json, sys
results = sys.stdout
sys.stdout = sys.stderr  # the submission's prints do not mix with the results
inputs = json.load(open("inputs.json"))
def report(**fields):
    results.write({_RESULT_MARK!r} + json.dumps(fields) + "\\n")
    results.flush()
try:
    import solution
    fn = getattr(solution, {name!r})
except BaseException as e:
    report(load_error=f"{{type(e).__name__}}: {{e}}")
    raise SystemExit(0)
for i, args in enumerate(inputs):
    try:
        value = fn(*args)
    except BaseException as e:
        report(i=i, error=f"{{type(e).__name__}}: {{e}}"[:200])
        continue
    try:
        report(i=i, value=value)
    except (TypeError, ValueError):
        report(i=i, error=f"returned {{type(value).__name__}} {{value!r:.100}}, not a JSON value (use lists, ints, str, ...)")
"""


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    return type(got) is type(want) and got == want


@dataclass(frozen=True)
class Grade:
    """The verdict on one submission."""

    passed: tuple[bool, ...]
    details: tuple[str, ...]
    """Per test: ``""`` when passed, else ``"expected X, got Y"`` / ``"raised E"`` / ``"no result"``."""
    error: str
    """Why the program as a whole failed (load error, limit, crash), or ``""``."""

    @property
    def fraction(self) -> float:
        return sum(self.passed) / len(self.passed)


def grade(task: CodeTask, code: str, limits: Limits) -> Grade:
    """Run ``code`` against every test of ``task`` in the sandbox and compare with the expected values."""
    with _RUN_SLOTS:
        run = run_python(_harness(task.name), files={"solution.py": code, "inputs.json": json.dumps(task.inputs)}, limits=limits)
    results: dict[int, dict[str, Any]] = {}
    load_error = ""
    for line in run.stdout.splitlines():
        if line.startswith(_RESULT_MARK):
            try:
                record = json.loads(line[len(_RESULT_MARK):])
            except json.JSONDecodeError:
                continue
            if "load_error" in record:
                load_error = str(record["load_error"])
            elif isinstance(record.get("i"), int) and record["i"] not in results:
                results[record["i"]] = record
    passed, details = [], []
    for i, want in enumerate(task.expected):
        record = results.get(i)
        if record is None:
            ok, detail = False, "not run (see the error)" if load_error else "no result (the program stopped before this test)"
        elif "error" in record:
            ok, detail = False, f"raised {record['error']}"
        else:
            ok = _same(record.get("value"), want)
            detail = "" if ok else f"expected {want!r}, got {record.get('value')!r}"
        passed.append(ok)
        details.append(detail)
    return Grade(tuple(passed), tuple(details), load_error or _program_error(run, len(results) < len(task.expected)))


def _program_error(run: SandboxResult, missing: bool) -> str:
    if run.killed_by is not None:
        return f"your program was {run.describe()}"
    if not missing:
        return ""
    if run.exit_code not in (0, None):
        tail = run.stderr.strip().splitlines()[-1:] or [run.describe()]
        return f"your program crashed: {tail[0][:200]}"
    return f"your program stopped before every test ran ({run.describe()})"


class CodeEnv(Env):
    """Write a Python function that passes hidden tests (see the module docstring).

    Args:
        templates: the task templates to draw from (default: all of ``TEMPLATES``).
        num_tests: hidden tests per task (at most 8).
        num_visible: how many of them are shown as examples (and reported by name when they fail).
        cpu_seconds, wall_seconds, memory_mb: sandbox limits for one submission's test run.
        max_lines: only the templates whose gold program has at most this many non-blank lines (the difficulty;
            :func:`program_lines`); None: no limit.
    """

    instructions = (
        "You write Python functions. Each task describes one function; answer with the complete function in a "
        "```python code block (the standard library may be imported). Hidden tests check it. If some tests fail "
        "you see which examples failed and may submit a corrected function."
    )
    blocking_io = True  # each step runs a sandboxed subprocess (up to wall_seconds): keep the other episodes going

    def __init__(
        self,
        templates: list[str] | None = None,
        num_tests: int = 8,
        num_visible: int = 2,
        cpu_seconds: int = 2,
        wall_seconds: float = 5.0,
        memory_mb: int = 256,
        max_lines: int | None = None,
    ) -> None:
        unknown = sorted(set(templates or ()) - set(TEMPLATES))
        if unknown:
            raise ValueError(f"unknown code templates {unknown}; valid: {', '.join(TEMPLATES)}")
        if templates is not None and not templates:
            raise ValueError("templates=[] leaves no task to draw; pass None for all templates")
        if not 1 <= num_tests <= 8:
            raise ValueError(f"num_tests={num_tests} must be between 1 and 8")
        if not 0 <= num_visible <= num_tests:
            raise ValueError(f"num_visible={num_visible} must be between 0 and num_tests={num_tests}")
        chosen = [t for t in templates or TEMPLATES if max_lines is None or program_lines(t) <= max_lines]
        if not chosen:
            shortest = min(program_lines(t) for t in templates or TEMPLATES)
            raise ValueError(f"max_lines={max_lines} leaves no template: the shortest gold program among them has "
                             f"{shortest} lines; raise max_lines")
        check_isolation()  # fail at construction, not in the middle of training
        self.templates = chosen
        self.num_tests, self.num_visible = num_tests, num_visible
        self.limits = Limits(cpu_seconds=cpu_seconds, wall_seconds=wall_seconds, memory_mb=memory_mb)
        self._rng = random.Random()
        self.task: CodeTask = make_task(random.Random(0), self.templates[0], num_tests)
        self.last: Grade | None = None
        self.done = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Draw the task for ``seed``. ``info`` holds the template and function name."""
        if seed is not None:
            self._rng = random.Random(seed)
        self.task = make_task(self._rng, self._rng.choice(self.templates), self.num_tests)
        self.last, self.done = None, False
        return self.render(), {"template": self.task.template, "function": self.task.name}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Grade the last code block of ``action_text``; see the module docstring for reward and feedback."""
        if self.done:
            raise RuntimeError("step() after the episode terminated; call reset() first")
        code = extract_code(action_text)
        before = self.last.fraction if self.last else 0.0
        if code is None or not code.strip():
            info = {"actions": [], "valid": False, "success": False, "reward_components": {"tests": 0.0},
                    "tests_passed": round(before * self.num_tests), "tests_total": self.num_tests}
            return f"No code block found. {_ANSWER_HINT}\n\n{self.render()}", 0.0, False, False, info
        self.last = grade(self.task, code, self.limits)
        reward = self.last.fraction - before
        success = all(self.last.passed)
        self.done = success
        info = {"actions": [code], "valid": True, "success": success, "reward_components": {"tests": reward},
                "tests_passed": sum(self.last.passed), "tests_total": self.num_tests}
        return self.render(), reward, success, False, info

    async def astep(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """``step`` in a worker thread, so concurrent episodes' test runs overlap."""
        return await asyncio.to_thread(self.step, action_text)

    def anchor(self) -> str:
        """The task and which tests the latest submission passed (``-`` before any submission)."""
        pattern = "".join("P" if ok else "F" for ok in self.last.passed) if self.last else "-"
        digest = hashlib.sha1(f"{self.task.solution}{self.task.inputs}".encode()).hexdigest()[:12]
        return f"{self.task.template}:{digest}|{pattern}"

    def task_key(self) -> str:
        """``"<template>:<digest of the gold program>"``: the program to write (its drawn parameters included), so
        seeds that draw the same program with other test inputs are the same task."""
        return f"{self.task.template}:{hashlib.sha1(self.task.solution.encode()).hexdigest()[:12]}"

    def solve(self) -> list[str] | None:
        """One submission of the gold solution (nothing left to do once every test passes)."""
        return [] if self.done else [f"```python\n{self.task.solution}```"]

    def examples(self) -> list[tuple[str, str]]:
        """Two fixed tasks (templates ``clamp_list`` and ``caesar`` with seed-independent draws) and their gold answers."""
        out = []
        for template in ("clamp_list", "caesar"):
            task = make_task(random.Random(f"example-{template}"), template, self.num_tests)
            out.append((self._statement(task), f"```python\n{task.solution}```"))
        return out

    def render(self) -> str:
        text = self._statement(self.task)
        if self.last is not None:
            text += "\n\n" + self._feedback(self.last)
        return text

    def _statement(self, task: CodeTask) -> str:
        lines = [f"Write a Python function `{task.signature}`.", task.description]
        if self.num_visible:
            lines.append("Examples:")
            lines += [f"  {task.call(task.inputs[i])} == {task.expected[i]!r}" for i in range(self.num_visible)]
        lines.append(_ANSWER_HINT)
        return "\n".join(lines)

    def _feedback(self, g: Grade) -> str:
        lines = [f"Your last submission passed {sum(g.passed)}/{len(g.passed)} tests."]
        if g.error:
            lines.append(f"Error: {g.error}")
        for i in range(self.num_visible):
            if not g.passed[i]:
                lines.append(f"Failed: {self.task.call(self.task.inputs[i])}: {g.details[i]}")
        hidden_failed = sum(not ok for ok in g.passed[self.num_visible:])
        if hidden_failed:
            lines.append(f"{hidden_failed} hidden test{'s' if hidden_failed > 1 else ''} failed.")
        lines.append("All tests passed." if all(g.passed) else f"Fix the function and submit it again. {_ANSWER_HINT}")
        return "\n".join(lines)
