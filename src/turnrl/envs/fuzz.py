"""Hostile model text: the seeded actions of ``check_env``'s fuzz stage, which every env must survive.

A policy can write anything its tokenizer decodes, and early in training it does: nothing, a wall of text,
control characters, half a tag, a tool call to a tool that does not exist, JSON of the wrong shape, a number
where the env expects a word. An env answers all of it with an observation (an invalid turn where the text
holds no valid action), never with an exception, and within its step time limit.

Case ``index`` of stream ``seed`` is a pure function of ``(seed, index, samples)``: its kind is
``KINDS[index % len(KINDS)]`` and its details come from ``random.Random(f"{seed}:{index}")``, so a failing
case is reproduced from the numbers ``check_env`` reports:

    from turnrl.envs.fuzz import fuzz_action
    env.reset(seed=1)
    env.step(fuzz_action(0, 7, [response for _, response in env.examples()]))

``samples`` are well-formed actions of the env (``check_env`` passes the responses of ``examples()``); the
kinds that mutate them (wrong argument types in a tool call, a truncated code block, digits spelled out)
reach past the env's parser into its verifier. The text is valid Unicode without lone surrogates, as every
decoded model output is.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence

_WORDS = ("Left", "up", "answer", "eight", "search", "click", "Buy Now", "SELECT", "def", "None")
_VALUES = ("null", "[1, 2]", '{"a": 1}', "1e309", "-0", "NaN", "true", "3.5", "99999999999999999999999",
           "six", "2 x 3", "2*3", "''", '""', "[]", "{}")
_WRONG_ARGUMENTS = (None, 7, -1.5, True, [], ["x"], {}, {"nested": {"deep": [None]}}, "", "x" * 300, "1/0")
_STRANGE = ("\x00", "\x01", "\x07", "\x08", "\x1b[2J\x1b[H", "\x7f", "\r", "\u202e", "\u200b", "\u200d", "\ufeff",
            "\ufffd", "e\u0301\u0301\u0301", "🧊🕳️🏁", "左 下 右 上", "Ｌｅｆｔ", "𝐋𝐞𝐟𝐭", "\u0663\u0664", "ß", "İ")
_NUMBERS = ("42", "-1", "0", "3.14", "1e100", "0x1F", "٣", "½", "1/0", "∞", "-0.0", "007")
_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_TAGS = (
    "<answer>", "</answer>", "<answer><answer>{s}</answer>", "<answer>{s}", "{s}</answer>", "<answer></answer></answer>",
    "<ANSWER>{s}</ANSWER>", "<answer>{s}</answer>" * 3, "<tool_call>", "<tool_call>{s}", "</tool_call>{s}",
    "<tool_call><tool_call>{s}</tool_call></tool_call>", "<tool_call></tool_call>", "```python\n", "```{s}",
    "``````", "```python\n```python\n{s}", "[[{s}]", "[{s}]]", "search[", "click[]]", "search[[{s}]]", "<think>{s}",
    "<|im_end|>{s}<|im_start|>", "<{s}>", "</{s}>", "{{{{{s}}}}}", "<answer>\n\n</answer>{s}",
)
_TAGGED = ("<answer>{v}</answer>", "```python\n{v}\n```", "[{v}]", "search[{v}]", "click[{v}]", "<tool_call>{v}</tool_call>")
_TOOL_NAMES = ("rm", "os.system", "__import__", "answer ", "ANSWER", "", "name", "tool_call", "search_web", "eval")


def fuzz_action(seed: int, index: int, samples: Sequence[str] = ()) -> str:
    """Case ``index`` of the hostile stream ``seed``, built from the env's well-formed ``samples`` (may be empty)."""
    rng = random.Random(f"{seed}:{index}")
    return KINDS[index % len(KINDS)](rng, list(samples) or list(_WORDS))


def fuzz_actions(seed: int, n: int, samples: Sequence[str] = ()) -> list[str]:
    """The first ``n`` cases of stream ``seed`` (every kind appears once ``n >= len(KINDS)``)."""
    return [fuzz_action(seed, i, samples) for i in range(n)]


def _blank(rng: random.Random, samples: list[str]) -> str:
    return rng.choice(["", " ", "\n", "\t \r\n ", "\u00a0\u2003\u3000", "\u200b\u200d\ufeff", "\n" * 500])


def _long(rng: random.Random, samples: list[str]) -> str:
    """20,000 to 100,000 characters: noise, a repeated sample, or one unbroken word."""
    size = rng.randint(20_000, 100_000)
    choice = rng.randrange(3)
    if choice == 0:
        alphabet = "abc XYZ 0123 <>[]{}()\"':,./\\\n\t" + "".join(_STRANGE)
        return "".join(rng.choice(alphabet) for _ in range(size))
    if choice == 1:
        sample = rng.choice(samples)
        return (sample + rng.choice(["", " ", "\n"])) * max(1, size // max(1, len(sample)))
    return rng.choice("aZ9<[{") * size


def _unicode(rng: random.Random, samples: list[str]) -> str:
    """Control characters, bidi and zero-width marks, combining accents, emoji, look-alike letters, around a sample."""
    parts = [rng.choice(_STRANGE) for _ in range(rng.randint(1, 8))]
    parts.insert(rng.randrange(len(parts) + 1), rng.choice(samples))
    return rng.choice(["", " ", "\n"]).join(parts)


def _tags(rng: random.Random, samples: list[str]) -> str:
    """Nested, unbalanced, misspelt and empty tags, code fences and brackets."""
    return rng.choice(_TAGS).replace("{s}", rng.choice(samples))


def _wrong_type_in_tags(rng: random.Random, samples: list[str]) -> str:
    """Well-formed tags and brackets around a value of the wrong type (null, a list, ``1e309``, ``six``, ...)."""
    return rng.choice(_TAGGED).format(v=rng.choice(_VALUES))


def _wrong_json(rng: random.Random, samples: list[str]) -> str:
    """JSON of the wrong shape: not an object, no or a non-string name, arguments that are not an object, deep nesting."""
    depth = rng.randint(1_000, 20_000)
    body = rng.choice([
        "[]", "{}", "null", '"name"', '{"name": 5}', '{"name": ""}', '{"name": null, "arguments": {}}',
        '{"name": "answer", "arguments": [1]}', '{"name": "answer", "arguments": "{"}', '{"name": "answer", "arguments": 3}',
        '{"name": ["answer"]}', '{"name": "answer", "parameters": null, "arguments": null}', '{"name": "answer"',
        "[" * depth + "]" * depth, '{"name": ' * depth, '{"a": ' * depth + "1" + "}" * depth,
    ])
    return rng.choice(["{j}", "<tool_call>{j}</tool_call>", "```json\n{j}\n```", "<answer>{j}</answer>"]).format(j=body)


def _swapped_kinds(rng: random.Random, samples: list[str]) -> str:
    """Numbers where words are expected and words where numbers are, alone or replacing a sample's tokens."""
    if rng.random() < 0.5:
        return rng.choice(_NUMBERS + _NUMBER_WORDS + ("twelve", "a few", "many", "left up", "NaN"))
    sample = rng.choice(samples)
    if re.search(r"\d", sample):
        return re.sub(r"\d", lambda m: _NUMBER_WORDS[int(m.group())], sample)
    return re.sub(r"[A-Za-z]+", lambda m: rng.choice(_NUMBERS), sample)


def _unknown_tool(rng: random.Random, samples: list[str]) -> str:
    """A call to a tool that does not exist, with arguments of the wrong shape, tagged or bare."""
    arguments = rng.choice([{"path": 1}, {"x": None}, [], "str", {"expression": 7}, {"sql": ["SELECT 1"]}, {}, None])
    body = json.dumps({"name": rng.choice(_TOOL_NAMES), "arguments": arguments})
    return rng.choice(["<tool_call>{b}</tool_call>", "{b}", "<tool_call>{b}"]).format(b=body)


def _mutated_sample(rng: random.Random, samples: list[str]) -> str:
    """A well-formed sample broken one way: cut short, doubled, case-flipped, or with wrong-typed JSON arguments."""
    sample = rng.choice(samples)
    mutations: list[Callable[[str], str]] = [
        lambda s: s[: rng.randrange(len(s) + 1)],
        lambda s: s + s[: rng.randrange(len(s) + 1)],
        lambda s: s.swapcase(),
        lambda s: s.replace("<", "< ").replace("[", "[["),
        lambda s: _wrong_arguments(rng, s),
    ]
    return rng.choice(mutations)(sample)


def _wrong_arguments(rng: random.Random, text: str) -> str:
    """``text`` with every JSON object's argument values (or its own values) replaced by wrong-typed ones."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while (start := text.find("{", i)) != -1:
        try:
            obj, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            out.append(text[i : start + 1])
            i = start + 1
            continue
        if isinstance(obj, dict):
            target = obj["arguments"] if isinstance(obj.get("arguments"), dict) else obj
            for key in list(target):
                if key != "name":
                    target[key] = rng.choice(_WRONG_ARGUMENTS)
            if rng.random() < 0.3:
                target["unexpected"] = rng.choice(_WRONG_ARGUMENTS)
        out.append(text[i:start] + json.dumps(obj))
        i = end
    mutated = "".join(out) + text[i:]
    return mutated if mutated != text else text + json.dumps({"arguments": rng.choice(_WRONG_ARGUMENTS)})


KINDS: tuple[Callable[[random.Random, list[str]], str], ...] = (
    _blank, _long, _unicode, _tags, _wrong_type_in_tags, _wrong_json, _swapped_kinds, _unknown_tool, _mutated_sample,
)
"""The kinds of hostile text, in the order the stream cycles through them."""
