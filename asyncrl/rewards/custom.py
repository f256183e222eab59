"""Loading a user's reward function, as verl's ``custom_reward_function`` does.

A spec is ``"path/to/file.py:function_name"`` (``"path/to/file.py"`` alone means verl's default name
``compute_score``), or ``"package.module:function_name"`` for an importable module. The function has verl's signature
``fn(data_source, solution_str, ground_truth, extra_info) -> float | dict`` and receives the *whole* decoded response:
answer extraction is up to it.

Everything that can be wrong with a spec is reported when it is loaded (at start-up), naming the spec.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncrl.errors import UserInputError

DEFAULT_FUNCTION_NAME = "compute_score"

ScoreFn = Callable[[str, str, str, dict[str, Any]], Any]


class RewardSpecError(UserInputError, ValueError):
    """A custom reward function spec cannot be loaded; the message names the spec."""


def parse_spec(spec: str) -> tuple[str, str, bool]:
    """Split a spec into ``(file path or module, function name, is_file)``."""
    if not isinstance(spec, str) or not spec.strip():
        raise RewardSpecError(f"custom reward function spec must be 'path/to/file.py:function_name' (got {spec!r})")
    target, sep, name = spec.strip().rpartition(":")
    if not sep:  # no colon: the whole spec is the target
        target, name = spec.strip(), DEFAULT_FUNCTION_NAME
    if not target or not name:
        raise RewardSpecError(f"custom reward function {spec!r}: expected 'path/to/file.py:function_name'")
    is_file = target.endswith(".py") or "/" in target or "\\" in target
    if not is_file and not sep:
        raise RewardSpecError(
            f"custom reward function {spec!r}: expected 'path/to/file.py:function_name' or 'package.module:function'"
        )
    return target, name, is_file


def _load_file_module(path: Path, spec: str) -> Any:
    if not path.is_file():
        raise RewardSpecError(f"custom reward function {spec!r}: no such file {path}")
    # A unique module name per file, so two reward files called reward.py do not shadow each other in sys.modules.
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    module_name = f"asyncrl_custom_reward_{path.stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    import_spec = importlib.util.spec_from_file_location(module_name, path)
    if import_spec is None or import_spec.loader is None:
        raise RewardSpecError(f"custom reward function {spec!r}: cannot import {path}")
    module = importlib.util.module_from_spec(import_spec)
    sys.modules[module_name] = module
    try:
        import_spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[module_name]
        raise RewardSpecError(
            f"custom reward function {spec!r}: importing {path} failed: {type(e).__name__}: {e}"
        ) from e
    return module


def load_custom_function(spec: str) -> ScoreFn:
    """Import and return the function a spec names; ``RewardSpecError`` if the file, module or function is wrong."""
    target, name, is_file = parse_spec(spec)
    if is_file:
        module = _load_file_module(Path(target), spec)
    else:
        try:
            module = importlib.import_module(target)
        except Exception as e:
            raise RewardSpecError(f"custom reward function {spec!r}: cannot import module {target!r}: {e}") from e
    if not hasattr(module, name):
        public = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise RewardSpecError(
            f"custom reward function {spec!r}: {target} has no function {name!r} (callables there: {public})"
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise RewardSpecError(f"custom reward function {spec!r}: {name!r} is a {type(fn).__name__}, not callable")
    return fn
