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


def parse_spec(spec: str, what: str = "custom reward function", name_: str = "function_name") -> tuple[str, str, bool]:
    """Split a spec into ``(file path or module, function name, is_file)``; ``name_`` is what messages call the
    part after the colon."""
    if not isinstance(spec, str) or not spec.strip():
        raise RewardSpecError(f"{what} spec must be 'path/to/file.py:{name_}' (got {spec!r})")
    target, sep, name = spec.strip().rpartition(":")
    if not sep:  # no colon: the whole spec is the target
        target, name = spec.strip(), DEFAULT_FUNCTION_NAME
    if not target or not name:
        raise RewardSpecError(f"{what} {spec!r}: expected 'path/to/file.py:{name_}'")
    is_file = target.endswith(".py") or "/" in target or "\\" in target
    if not is_file and not sep:
        raise RewardSpecError(f"{what} {spec!r}: expected 'path/to/file.py:{name_}' or 'package.module:{name_}'")
    return target, name, is_file


def _load_file_module(path: Path, spec: str, what: str) -> Any:
    if not path.is_file():
        raise RewardSpecError(f"{what} {spec!r}: no such file {path}")
    # A unique module name per file, so two reward files called reward.py do not shadow each other in sys.modules.
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    module_name = f"asyncrl_custom_reward_{path.stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    import_spec = importlib.util.spec_from_file_location(module_name, path)
    if import_spec is None or import_spec.loader is None:
        raise RewardSpecError(f"{what} {spec!r}: cannot import {path}")
    module = importlib.util.module_from_spec(import_spec)
    sys.modules[module_name] = module
    try:
        import_spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[module_name]
        raise RewardSpecError(f"{what} {spec!r}: importing {path} failed: {type(e).__name__}: {e}") from e
    return module


def load_named(spec: str, what: str, kind: str = "function") -> Any:
    """What ``"path/to/file.py:name"`` or ``"package.module:name"`` names (a reward function, an agent loop class);
    ``RewardSpecError`` naming ``what`` and the spec if the file, module or name is wrong."""
    target, name, is_file = parse_spec(spec, what, "function_name" if kind == "function" else "ClassName")
    if is_file:
        module = _load_file_module(Path(target), spec, what)
    else:
        try:
            module = importlib.import_module(target)
        except Exception as e:
            raise RewardSpecError(f"{what} {spec!r}: cannot import module {target!r}: {e}") from e
    if not hasattr(module, name):
        public = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise RewardSpecError(f"{what} {spec!r}: {target} has no {kind} {name!r} (callables there: {public})")
    return getattr(module, name)


def load_custom_function(spec: str) -> ScoreFn:
    """Import and return the function a spec names; ``RewardSpecError`` if the file, module or function is wrong. A
    spec ending in ``.pkl`` is a callable pickled by value (``asyncrl.train(reward=fn)`` writes one)."""
    if isinstance(spec, str) and spec.endswith(".pkl"):
        return _unpickle(Path(spec))
    fn = load_named(spec, "custom reward function")
    if not callable(fn):
        name = parse_spec(spec)[1]
        raise RewardSpecError(f"custom reward function {spec!r}: {name!r} is a {type(fn).__name__}, not callable")
    return fn


def _unpickle(path: Path) -> ScoreFn:
    import cloudpickle

    try:
        fn = cloudpickle.loads(path.read_bytes())
    except Exception as e:
        raise RewardSpecError(f"custom reward function {str(path)!r}: cannot unpickle: {type(e).__name__}: {e}") from e
    if not callable(fn):
        raise RewardSpecError(f"custom reward function {str(path)!r}: holds a {type(fn).__name__}, not a callable")
    return fn
