"""Loading what a spec names: ``"path/to/file.py:name"`` (a file imported under a name of its own) or
``"package.module:name"`` (an importable module). Reward functions (``reward.custom_function``) and agent loops
(``rollout.agent.default_agent_loop``) are named so, and every error names the spec.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from asyncrl.errors import UserInputError


class SpecError(UserInputError, ValueError):
    """A spec cannot be loaded; the message names it."""


def parse_spec(
    spec: str, what: str, name_: str = "function_name", default: str | None = None, error: type[SpecError] = SpecError
) -> tuple[str, str, bool]:
    """Split a spec into ``(file path or module, name, is_file)``; ``name_`` is what messages call the part after the
    colon, ``default`` the name a spec without one means (None: a colon is required)."""
    if not isinstance(spec, str) or not spec.strip():
        raise error(f"{what} spec must be 'path/to/file.py:{name_}' (got {spec!r})")
    target, sep, name = spec.strip().rpartition(":")
    if not sep:  # no colon: the whole spec is the target
        target, name = spec.strip(), default or ""
    if not target or not name:
        raise error(f"{what} {spec!r}: expected 'path/to/file.py:{name_}'")
    is_file = target.endswith(".py") or "/" in target or "\\" in target
    if not is_file and not sep:
        raise error(f"{what} {spec!r}: expected 'path/to/file.py:{name_}' or 'package.module:{name_}'")
    return target, name, is_file


def _load_file_module(path: Path, spec: str, what: str, error: type[SpecError]) -> ModuleType:
    if not path.is_file():
        raise error(f"{what} {spec!r}: no such file {path}")
    # A unique module name per file, so two files called reward.py do not shadow each other in sys.modules.
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    module_name = f"asyncrl_custom_{path.stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    import_spec = importlib.util.spec_from_file_location(module_name, path)
    if import_spec is None or import_spec.loader is None:
        raise error(f"{what} {spec!r}: cannot import {path}")
    module = importlib.util.module_from_spec(import_spec)
    sys.modules[module_name] = module
    try:
        import_spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[module_name]
        raise error(f"{what} {spec!r}: importing {path} failed: {type(e).__name__}: {e}") from e
    return module


def load_named(
    spec: str, what: str, kind: str = "function", default: str | None = None, error: type[SpecError] = SpecError
) -> Any:
    """What ``"path/to/file.py:name"`` or ``"package.module:name"`` names (a reward function, an agent loop class);
    ``error`` naming ``what`` and the spec if the file, module or name is wrong."""
    name_ = "function_name" if kind == "function" else "ClassName"
    target, name, is_file = parse_spec(spec, what, name_, default, error)
    if is_file:
        module = _load_file_module(Path(target), spec, what, error)
    else:
        try:
            module = importlib.import_module(target)
        except Exception as e:
            raise error(f"{what} {spec!r}: cannot import module {target!r}: {e}") from e
    if not hasattr(module, name):
        public = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise error(f"{what} {spec!r}: {target} has no {kind} {name!r} (callables there: {public})")
    return getattr(module, name)
