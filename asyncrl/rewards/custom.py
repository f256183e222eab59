"""Loading a user's reward function, as verl's ``custom_reward_function`` does (spec and signature: docs/rewards.md,
"Which function scores a response"); it receives the whole decoded response, so answer extraction is up to it. Every
fault of a spec is reported when it is loaded (at start-up), naming the spec.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncrl.named import SpecError, load_named, parse_spec

DEFAULT_FUNCTION_NAME = "compute_score"

ScoreFn = Callable[[str, str, str, dict[str, Any]], Any]


class RewardSpecError(SpecError):
    """A custom reward function spec cannot be loaded; the message names the spec."""


def load_custom_function(spec: str) -> ScoreFn:
    """Import and return the function a spec names; ``RewardSpecError`` if the file, module or function is wrong. A
    spec ending in ``.pkl`` is a callable pickled by value (``asyncrl.train(reward=fn)`` writes one)."""
    what = "custom reward function"
    if isinstance(spec, str) and spec.endswith(".pkl"):
        import cloudpickle

        path = str(Path(spec))
        try:
            fn = cloudpickle.loads(Path(spec).read_bytes())
        except Exception as e:
            raise RewardSpecError(f"{what} {path!r}: cannot unpickle: {type(e).__name__}: {e}") from e
        if not callable(fn):
            raise RewardSpecError(f"{what} {path!r}: holds a {type(fn).__name__}, not a callable")
        return fn
    fn = load_named(spec, what, default=DEFAULT_FUNCTION_NAME, error=RewardSpecError)
    if not callable(fn):
        name = parse_spec(spec, what, default=DEFAULT_FUNCTION_NAME, error=RewardSpecError)[1]
        raise RewardSpecError(f"{what} {spec!r}: {name!r} is a {type(fn).__name__}, not callable")
    return fn
