"""Pulling the final answer out of a model response.

Models answer in several conventions: reasoning-gym asks for ``<answer>...</answer>``, GSM8K uses ``#### 42``, chat
models often end with ``Answer: 42``, and small models trained on bare-answer prompts just print ``42``. Scorers that
compare a single answer (reasoning-gym's ``score_answer``) need that answer alone, not the reasoning before it.
"""

from __future__ import annotations

import re

ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_MARKER = re.compile(r"####|\banswer\s*:", re.IGNORECASE)


def _clean(text: str) -> str:
    """Strip whitespace and markdown emphasis around an answer (``**42**`` -> ``42``); inner text is untouched."""
    return text.strip().strip("*").strip()


def extract_answer(text: str) -> str:
    """The final answer in ``text``, stripped; ``""`` if there is none.

    Rules, first match wins:

    1. the content of the last complete ``<answer>...</answer>`` tag (an unclosed tag, as in a truncated response,
       does not count);
    2. after the last ``####`` or ``Answer:`` marker (case-insensitive, e.g. ``Final answer: 7``): the first
       non-empty line that follows it, so ``Answer: 7\\nHope this helps`` gives ``7`` and ``Answer:\\n7`` too;
    3. otherwise the last non-empty line.

    Leading/trailing ``*`` (markdown bold) is stripped in every case.
    """
    if not text:
        return ""
    tags = ANSWER_TAG_RE.findall(text)
    if tags:
        return _clean(tags[-1])
    markers = list(_MARKER.finditer(text))
    if markers:
        rest = text[markers[-1].end() :]
        for line in rest.splitlines():
            if _clean(line):
                return _clean(line)
        return ""
    lines = [line for line in text.splitlines() if _clean(line)]
    return _clean(lines[-1]) if lines else ""
