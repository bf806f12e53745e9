"""Parse actions from free model text.

Models answer in many shapes: ``<answer>Right</answer>``, ``Right``, ``right.``, ``I move Right then Up``.
The rule: if the text holds ``<answer>...</answer>``, only the (last) tag's content counts; otherwise the
whole text. Action words are matched case-insensitively as whole words, in order of appearance, and at
most ``limit`` are returned. Nothing here raises on model text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)


def parse_actions(text: str, vocabulary: Sequence[str], limit: int = 1) -> list[str]:
    """Canonical action names found in ``text`` (see module docstring). Empty when there is none."""
    tagged = _ANSWER.findall(text)
    body = tagged[-1] if tagged else text
    words = {w.lower(): w for w in vocabulary}
    pattern = re.compile(r"\b(" + "|".join(re.escape(w) for w in vocabulary) + r")\b", re.IGNORECASE)
    found = [words[m.group(1).lower()] for m in pattern.finditer(body)]
    return found[: max(0, limit)]
