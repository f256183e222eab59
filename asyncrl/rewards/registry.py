"""Which scorer handles which ``data_source``: one added with ``register_scorer`` (exact name), else
``MATH_DATA_SOURCES`` (math-verify), else any reasoning-gym dataset name (its task's ``score_answer``); anything else
raises ``UnknownDataSourceError``, naming the data source and what is known.
"""

from __future__ import annotations

from asyncrl.data.tasks import reasoning_gym_names
from asyncrl.errors import UserInputError
from asyncrl.rewards.custom import ScoreFn
from asyncrl.rewards.scorers import math_verify_score, reasoning_gym_score

MATH_DATA_SOURCES: frozenset[str] = frozenset(
    {
        "math",
        "gsm8k",
        "openai/gsm8k",
        "lighteval/MATH",
        "DigitalLearningGmbH/MATH-lighteval",
        "HuggingFaceH4/MATH-500",
        "math500",
        "aime",
        "aime2024",
        "aime2025",
    }
)
"""Data sources scored with math-verify. verl's own gsm8k scorer insists on the ``####`` format; this one does not."""

_REGISTRY: dict[str, ScoreFn] = {}


class UnknownDataSourceError(UserInputError, KeyError):
    """No scorer handles a data source. ``str()`` gives the plain message (``KeyError`` would quote it)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def register_scorer(data_source: str, fn: ScoreFn, overwrite: bool = False) -> None:
    """Score rows with ``data_source`` by ``fn`` (verl signature); refuses to replace one unless ``overwrite``."""
    if not callable(fn):
        raise TypeError(f"register_scorer({data_source!r}): scorer must be callable (got {type(fn).__name__})")
    if data_source in _REGISTRY and not overwrite:
        raise ValueError(f"register_scorer: a scorer for {data_source!r} exists already (pass overwrite=True)")
    _REGISTRY[data_source] = fn


def unregister_scorer(data_source: str) -> None:
    """Remove a scorer added with ``register_scorer`` (no error if there is none)."""
    _REGISTRY.pop(data_source, None)


def get_scorer(data_source: str) -> ScoreFn:
    """The scorer for ``data_source``, in the module docstring's order."""
    if data_source in _REGISTRY:
        return _REGISTRY[data_source]
    if data_source in MATH_DATA_SOURCES:
        return math_verify_score
    rg_names = reasoning_gym_names()
    if data_source in rg_names:
        return reasoning_gym_score
    registered = ", ".join(sorted(_REGISTRY)) or "none"
    raise UnknownDataSourceError(
        f"no reward scorer for data_source {data_source!r}: known are registered ({registered}), "
        f"math-verify ({', '.join(sorted(MATH_DATA_SOURCES))}) and any of the {len(rg_names)} reasoning-gym tasks "
        "(e.g. chain_sum, basic_arithmetic, countdown); register one with register_scorer or pass a custom function"
    )


def known_data_sources() -> list[str]:
    """Every data source ``get_scorer`` accepts, sorted."""
    return sorted(set(_REGISTRY) | MATH_DATA_SOURCES | set(reasoning_gym_names()))
