"""Built-in tasks generated procedurally by reasoning-gym (nothing is downloaded: item i is built from
``random.Random(seed + i)``), written as verl-schema rows. ``TASKS`` holds tasks with default generation settings
tuned small, for small models; any other reasoning-gym dataset name works with reasoning-gym's defaults.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.data.rows import write_rows

TEST_SEED_OFFSET = 1_000_000_000
"""Added to the seed for the test split; train items use seeds ``seed .. seed + size - 1``, so they never collide."""


@dataclass(frozen=True)
class TaskSpec:
    """A reasoning-gym dataset plus the settings this project uses for it.

    ``defaults`` are generation kwargs of the dataset's config class (overridable per call); ``score_metadata`` lists
    the ``metadata`` keys its ``score_answer`` reads, so the reward can refuse rows that lack them instead of silently
    scoring them as wrong.
    """

    name: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    ability: str = "math"
    score_metadata: tuple[str, ...] = ()


TASKS: dict[str, TaskSpec] = {}


def register_task(
    name: str, defaults: Mapping[str, Any] | None = None, ability: str = "math", score_metadata: tuple[str, ...] = ()
) -> TaskSpec:
    """Add (or replace) a task; ``name`` must be a reasoning-gym dataset name (checked when it is first used)."""
    spec = TaskSpec(name, dict(defaults or {}), ability, tuple(score_metadata))
    TASKS[name] = spec
    return spec


# "chain_sum": "State the final answer to the following arithmetic problem: 4 - 1 - 7 =" -> "-4"
register_task("chain_sum", {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 2})
# "basic_arithmetic": "Calculate ( 2 + -8 ) + 4." -> "-2" (+ - * and exact integer /, with parentheses)
register_task("basic_arithmetic", {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 2})
# "countdown": "Calculate 309 using all of these numbers: 6, 61, 94, 4. ..." -> any expression using exactly those
# numbers that evaluates to the target; score_answer reads metadata["numbers"] and metadata["target"].
register_task("countdown", {"min_numbers": 3, "max_numbers": 4}, score_metadata=("numbers", "target"))


def chain_sum_solution(entry: Mapping[str, Any]) -> str:
    """A worked solution with running sums, one operation per line, ending in ``#### <answer>``.

    ``"12 + 5 - 3 ="`` -> ``"12+5=17\n17-3=14\n#### 14"``. Used as the SFT target (``data.response_key=solution``)
    for a generation-heavy workload whose response length grows with the number of terms; the reward reads the
    answer after ``####`` (see ``asyncrl.rewards.scorers.extract_answer``).
    """
    tokens = str((entry.get("metadata") or {})["expression"]).split()
    total, lines = int(tokens[0]), []
    for op, num in zip(tokens[1::2], tokens[2::2]):
        new = total + int(num) if op == "+" else total - int(num)
        lines.append(f"{total}{op}{int(num)}={new}")
        total = new
    if total != int(str(entry["answer"])):
        raise ValueError(f"chain_sum_solution: {entry['question']!r} sums to {total}, not {entry['answer']}")
    return "\n".join(lines + [f"#### {total}"])


SOLUTIONS = {"chain_sum": chain_sum_solution}
"""Tasks whose rows also carry ``extra_info["solution"]``, a worked solution for step-by-step SFT."""


def reasoning_gym_names() -> list[str]:
    """All dataset names the installed reasoning-gym provides."""
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def get_task(name: str) -> TaskSpec:
    """The registered task, or a default spec for any other reasoning-gym dataset; else ``ValueError`` listing both."""
    if name in TASKS:
        return TASKS[name]
    rg_names = reasoning_gym_names()
    if name in rg_names:
        return TaskSpec(name)
    raise ValueError(
        f"unknown task {name!r}: built-in tasks are {', '.join(sorted(TASKS))}; "
        f"any reasoning-gym dataset also works: {', '.join(rg_names)}"
    )


def _generation_kwargs(task: str, task_kwargs: Mapping[str, Any]) -> tuple[TaskSpec, dict[str, Any]]:
    """The task's spec and its generation kwargs: the defaults updated with ``task_kwargs``.

    Bad kwargs raise ``ValueError`` naming the task and listing the config fields it accepts (reasoning-gym itself
    raises a bare ``TypeError``/``AssertionError``).
    """
    from reasoning_gym.factory import DATASETS

    spec = get_task(task)
    kwargs = {**spec.defaults, **task_kwargs}
    for reserved in ("size", "seed"):
        if reserved in kwargs:
            raise ValueError(f"task {task!r}: pass {reserved!r} as an argument, not as a task kwarg")
    _, config_cls = DATASETS[task]
    allowed = sorted(f.name for f in dataclasses.fields(config_cls) if f.name not in ("size", "seed"))
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(f"task {task!r}: unknown kwargs {unknown} (allowed: {', '.join(allowed)})")
    return spec, kwargs


def _json_default(value: Any) -> Any:
    """Make reasoning-gym metadata JSON-able: sets become sorted lists, numpy scalars/arrays plain values."""
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    if hasattr(value, "tolist"):
        return value.tolist()
    return repr(value)


def render_prompt(template: str, entry: Mapping[str, Any], where: str = "prompt_template") -> str:
    """The user message for ``entry``: ``template`` formatted with ``question`` and the entry's metadata fields.

    The default ``"{question}"`` is reasoning-gym's own wording. A shorter template (e.g. ``"{expression} ="`` for
    chain_sum) keeps the same task and scorer but costs far fewer tokens per sample, which matters for a
    character-level model on a CPU.
    """
    fields = {**dict(entry.get("metadata") or {}), "question": str(entry["question"])}
    try:
        return template.format(**fields)
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f"{where} {template!r}: cannot fill it ({e!r}); available fields: {sorted(fields)}") from None


def _rows(
    spec: TaskSpec, entries: list[dict[str, Any]], split: str, kwargs: Mapping[str, Any], prompt_template: str
) -> list[dict[str, Any]]:
    """The verl-schema rows of ``entries``. ``extra_info`` holds only parquet-friendly values: ``task_kwargs`` (the
    full generation kwargs, defaults included) and ``metadata`` (reasoning-gym's per-item metadata) are JSON strings,
    which the reward decodes."""
    kwargs_json = json.dumps(kwargs, sort_keys=True, default=_json_default)
    rows = []
    for index, entry in enumerate(entries):
        question, answer = str(entry["question"]), str(entry["answer"])
        rows.append(
            {
                "data_source": spec.name,
                "prompt": [{"role": "user", "content": render_prompt(prompt_template, entry)}],
                "ability": spec.ability,
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {
                    "split": split,
                    "index": index,
                    "answer": answer,
                    "question": question,
                    "task_kwargs": kwargs_json,
                    "metadata": json.dumps(entry.get("metadata", {}), default=_json_default),
                    **({"solution": SOLUTIONS[spec.name](entry)} if spec.name in SOLUTIONS else {}),
                },
            }
        )
    return rows


def _entries(task: str, seed: int, start: int, stop: int, kwargs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Items ``start .. stop - 1`` of the dataset seeded with ``seed`` (item i depends only on ``seed + i``)."""
    import reasoning_gym

    try:
        dataset = reasoning_gym.create_dataset(task, size=max(stop, 1), seed=seed, **kwargs)
    except (AssertionError, TypeError, ValueError) as e:
        raise ValueError(f"task {task!r}: invalid kwargs {kwargs}: {e}") from e
    return [dataset[i] for i in range(start, stop)]


def make_rows(
    task: str, size: int, seed: int, split: str, prompt_template: str = "{question}", **task_kwargs: Any
) -> list[dict[str, Any]]:
    """``size`` verl-schema rows of ``task`` generated from ``seed`` (same arguments, same rows)."""
    if size <= 0:
        raise ValueError(f"make_rows: size must be positive (got {size})")
    spec, kwargs = _generation_kwargs(task, task_kwargs)
    return _rows(spec, _entries(task, seed, 0, size, kwargs), split, kwargs, prompt_template)


def write_task_dataset(
    task: str,
    size: int,
    seed: int,
    out_dir: str | Path,
    test_size: int = 500,
    prompt_template: str = "{question}",
    **task_kwargs: Any,
) -> tuple[Path, Path]:
    """Write ``out_dir/train.parquet`` (``size`` rows) and ``out_dir/test.parquet`` (``test_size`` rows).

    The test split is drawn first, from ``seed + TEST_SEED_OFFSET``: the first ``test_size`` distinct questions, so it
    follows the task's own distribution of difficulty. The training split is then drawn from ``seed`` and skips every
    question in the test split (further items from the same seed take their place), so no test question is ever seen
    in training. Deduplicating the other way round (test skips train) would empty the test split of every question
    whose space is small enough for the training split to cover it: on chain_sum with 1-2 digits, all 2-term 1-digit
    sums, a quarter of the task. Tasks whose question space is too small raise a ``ValueError``. Returns
    ``(train_path, test_path)``.
    """
    if test_size <= 0:
        raise ValueError(f"write_task_dataset: test_size must be positive (got {test_size})")
    if size <= 0:
        raise ValueError(f"write_task_dataset: size must be positive (got {size})")
    spec, kwargs = _generation_kwargs(task, task_kwargs)
    held_out: set[str] = set()
    test_entries, drawn = _draw(task, seed + TEST_SEED_OFFSET, test_size, kwargs, skip=held_out, distinct=True)
    if len(test_entries) < test_size:
        raise ValueError(
            f"task {task!r} with kwargs {kwargs}: only {len(test_entries)} of {test_size} test questions are distinct "
            f"after {drawn} draws; widen the task or lower test_size"
        )
    train_entries, drawn = _draw(task, seed, size, kwargs, skip=held_out, distinct=False)
    if len(train_entries) < size:
        raise ValueError(
            f"task {task!r} with kwargs {kwargs}: only {len(train_entries)} of {size} training items avoid the "
            f"{test_size} test questions after {drawn} draws; widen the task or lower test_size"
        )
    out = Path(out_dir)
    return (
        write_rows(out / "train.parquet", _rows(spec, train_entries, "train", kwargs, prompt_template)),
        write_rows(out / "test.parquet", _rows(spec, test_entries, "test", kwargs, prompt_template)),
    )


def _draw(
    task: str, seed: int, want: int, kwargs: Mapping[str, Any], skip: set[str], distinct: bool
) -> tuple[list[dict[str, Any]], int]:
    """Up to ``want`` items from ``seed`` in order, leaving out questions in ``skip``; with ``distinct``, each kept
    question is added to ``skip`` (so it is kept once). Gives up after ``10 * want + 100`` draws. Returns the items
    and how many were drawn."""
    kept: list[dict[str, Any]] = []
    drawn, max_draws = 0, 10 * want + 100
    while len(kept) < want and drawn < max_draws:
        chunk = min(max_draws, drawn + (want - len(kept)) + 16)
        for entry in _entries(task, seed, drawn, chunk, kwargs):
            question = str(entry["question"])
            if question not in skip and len(kept) < want:
                if distinct:
                    skip.add(question)
                kept.append(entry)
        drawn = chunk
    return kept, drawn
