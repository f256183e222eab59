"""Built-in scorers, with verl's signature ``fn(data_source, solution_str, ground_truth, extra_info) -> float``. Each
scores the answer ``extract_answer`` finds, not the whole response: models answer as ``<answer>...</answer>``
(reasoning-gym), ``#### 42`` (GSM8K), ``Answer: 42`` or a bare ``42``, and reasoning-gym's ``score_answer`` compares
that answer alone.
"""

from __future__ import annotations

import json
import re
import threading
from functools import lru_cache
from typing import Any

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


# Countdown's score_answer evaluates the answer with sympy's parse_expr, which accepts ``**`` and ``!`` (factorial):
# ``9**9**9**9`` or ``999999!`` from a model hangs the reward worker (observed), and neither is an allowed operator.
# Answers with ``**``, anything beyond digits, + - * / ( ) . = and spaces, or absurd length get countdown's "invalid"
# score without being evaluated.
_COUNTDOWN_SAFE = re.compile(r"^[\d\s+\-*/().=]*$")
_COUNTDOWN_MAX_CHARS = 500
_COUNTDOWN_INVALID_SCORE = 0.01


@lru_cache(maxsize=64)
def _rg_dataset(task: str, kwargs_json: str) -> Any:
    """One reasoning-gym dataset per (task, generation kwargs), for its ``score_answer`` only: ``size=1``, as that reads
    the entry and at most the config (hence the row's ``task_kwargs``)."""
    import reasoning_gym

    kwargs = json.loads(kwargs_json) if kwargs_json else {}
    return reasoning_gym.create_dataset(task, size=1, seed=0, **kwargs)


def _decode_json_field(extra_info: dict[str, Any], key: str, data_source: str) -> Any:
    value = extra_info.get(key)
    if value is None or isinstance(value, dict):
        return value
    try:
        return json.loads(value)
    except (TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"data_source {data_source!r}: extra_info[{key!r}] is not valid JSON ({e})") from e


@lru_cache(maxsize=64)
def _score_metadata(data_source: str) -> tuple[str, ...]:
    """The metadata keys the task's scorer reads, looked up once per data source (not per scored answer: for a
    reasoning-gym dataset outside the built-in tasks the lookup lists reasoning-gym's datasets)."""
    from asyncrl.data.tasks import get_task

    return tuple(get_task(data_source).score_metadata)


def reasoning_gym_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any]) -> float:
    """Score with reasoning-gym's ``score_answer`` for the task named by ``data_source``.

    The entry is rebuilt from the row: ``{"question": extra_info["question"], "answer": ground_truth,
    "metadata": json.loads(extra_info["metadata"])}``. Tasks whose scorer reads metadata (countdown: ``numbers``,
    ``target``) raise ``ValueError`` if it is missing, rather than score every answer as wrong.
    """
    extra_info = extra_info or {}
    metadata = _decode_json_field(extra_info, "metadata", data_source) or {}
    missing = [k for k in _score_metadata(data_source) if k not in metadata]
    if missing:
        raise ValueError(
            f"data_source {data_source!r}: scoring needs extra_info['metadata'] with keys {missing} "
            "(rows made by asyncrl.data.tasks have them)"
        )
    task_kwargs = _decode_json_field(extra_info, "task_kwargs", data_source) or {}
    dataset = _rg_dataset(data_source, json.dumps(task_kwargs, sort_keys=True))
    answer = extract_answer(solution_str)
    if data_source == "countdown" and (
        len(answer) > _COUNTDOWN_MAX_CHARS or "**" in answer or not _COUNTDOWN_SAFE.match(answer)
    ):
        return _COUNTDOWN_INVALID_SCORE
    entry = {"question": extra_info.get("question", ""), "answer": ground_truth, "metadata": metadata}
    return float(dataset.score_answer(answer, entry))


def math_verify_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any]) -> float:
    """1.0 if the response's answer is mathematically equal to ``ground_truth`` (math-verify), else 0.0.

    The answer parsed is the ``<answer>`` tag content if there is one; else the whole response if it contains
    ``\\boxed`` (math-verify finds the box itself); else ``extract_answer``'s result (``#### x``, ``Answer: x``, last
    line). An unparseable ground truth raises ``ValueError`` (a data problem, not a wrong answer).
    """
    from math_verify import parse, verify

    # math-verify's timeouts use ``signal.alarm``, which only works in the main thread; elsewhere run without
    timeouts = {} if threading.current_thread() is threading.main_thread() else {"parsing_timeout": None}
    gold = parse(ground_truth, **timeouts) or parse(f"${ground_truth}$", **timeouts)
    if not gold:
        raise ValueError(f"data_source {data_source!r}: math-verify cannot parse ground truth {ground_truth!r}")
    if "\\boxed" in solution_str and not ANSWER_TAG_RE.search(solution_str):
        candidate = solution_str
    else:
        candidate = extract_answer(solution_str)
    if not candidate:
        return 0.0
    pred = parse(candidate, **timeouts)
    if not pred:
        return 0.0
    verify_timeout = {"timeout_seconds": None} if timeouts else {}
    return 1.0 if verify(gold, pred, **verify_timeout) else 0.0


NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")


def final_number_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any]) -> float:
    """1.0 if the response's final answer is a written-out number equal to ``ground_truth``, else 0.0.

    The answer is ``extract_answer``'s (``<answer>``, ``#### x``, ``Answer: x``, else the last line), then the part
    after its last ``=`` ("4 + 7 = 11" counts as 11), stripped of a trailing period. It must be a number: math-verify
    evaluates an expression, so a reply that repeats the question ("4 + 7") scores as correct there, and RL finds
    that out (a 135M model learned to echo the question in 20 steps; BENCHMARKS.md).
    """
    answer = extract_answer(solution_str).rsplit("=", 1)[-1].strip().rstrip(".").strip()
    if not NUMBER_RE.fullmatch(answer):
        return 0.0
    try:
        return 1.0 if float(answer) == float(ground_truth) else 0.0
    except ValueError as e:
        raise ValueError(f"data_source {data_source!r}: ground truth {ground_truth!r} is not a number") from e
