"""Parse actions from free model text.

Models answer in many shapes: ``<answer>Right</answer>``, ``Right``, ``right.``, ``I move Right then Up``.
The rule: if the text holds a closed ``<answer>...</answer>`` tag, only the last tag's content counts;
otherwise the whole text does. Action words are matched case-insensitively as whole words (``Rightward``
is not ``Right``), in order of appearance, and at most ``limit`` are returned. Nothing here raises on
model text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)


def parse_actions(text: str, vocabulary: Sequence[str], limit: int = 1) -> list[str]:
    """The canonical names (as spelled in ``vocabulary``) of the actions in ``text``; empty when none is found."""
    tagged = _ANSWER.findall(text)
    body = tagged[-1] if tagged else text
    canonical = {word.lower(): word for word in vocabulary}
    pattern = re.compile(r"\b(" + "|".join(re.escape(word) for word in vocabulary) + r")\b", re.IGNORECASE)
    return [canonical[m.group(1).lower()] for m in pattern.finditer(body)][: max(0, limit)]
