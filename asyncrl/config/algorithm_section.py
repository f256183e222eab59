"""The ``algorithm:`` section, tagged by ``algorithm.name``: the loader parses it as the chosen algorithm's section
class (``Algorithm.section``, else ``AlgorithmConfig``), so a key no algorithm reads is an unknown key and a user's
algorithm brings its own keys (docs/config.md, "Two choices: the algorithm and the schedule"). The algorithm is found
by name as ``asyncrl.algorithms.algorithm_class`` finds it, a plugin lookup (``importlib``): the config, two floors
below the algorithms, imports none of them by statement.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import pkgutil
import re
from functools import cache
from types import ModuleType
from typing import Any

from asyncrl.config.errors import ConfigError, check
from asyncrl.config.training import AlgorithmConfig

BUILTIN = "asyncrl.algorithms"  # the package whose modules that name an ALGORITHM are the built-in algorithms
NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")  # a module's name, or a dotted import path


def check_algorithm_name(name: str) -> None:
    """``algorithm.name`` names a module (before anything is imported by it)."""
    check(
        NAME.fullmatch(name) is not None,
        "algorithm.name",
        name,
        "a built-in algorithm's name (grpo) or the import path of a module of yours that names its "
        "Algorithm subclass ALGORITHM (my_pkg.my_algo)",
    )


@cache
def builtin_classes() -> dict[str, Any]:
    """The built-in algorithms: the built-in package's modules that name an ``ALGORITHM``, by module name, with that
    class (each module imported once, the first time it is asked)."""
    spec = importlib.util.find_spec(BUILTIN)
    paths = list(spec.submodule_search_locations or []) if spec else []
    out = {}
    for n in sorted(m.name for m in pkgutil.iter_modules(paths) if m.name != "base"):
        algorithm = getattr(importlib.import_module(f"{BUILTIN}.{n}"), "ALGORITHM", None)
        if algorithm is not None:
            out[n] = algorithm
    return out


def algorithm_module(name: str) -> ModuleType:
    """The module of ``algorithm.name`` (imported); a name with no module is one error naming the built-in ones."""
    check_algorithm_name(name)
    target = name if "." in name else f"{BUILTIN}.{name}"  # a built-in name's module, or the user's import path
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        if e.name is None or not target.startswith(e.name):
            raise  # the module exists; something it imports does not
        raise ConfigError(
            f"config key algorithm.name={name!r}: no module {target} to import (built in: "
            f"{', '.join(builtin_classes())}; or "
            "the import path of a module of yours that names its Algorithm subclass ALGORITHM, my_pkg.my_algo)"
        ) from None


def section_class(name: str) -> type[AlgorithmConfig]:
    """The ``algorithm:`` section's class for ``algorithm.name``: its algorithm's ``section`` (``AlgorithmConfig``
    when it declares none; a module without an ``ALGORITHM`` is named by ``algorithm_class`` later)."""
    cls = getattr(getattr(algorithm_module(name), "ALGORITHM", None), "section", AlgorithmConfig)
    return cls if isinstance(cls, type) and issubclass(cls, AlgorithmConfig) else AlgorithmConfig


def other_algorithms_defaults(section: dict[str, object], chosen: type[AlgorithmConfig], name: str) -> list[str]:
    """The keys of ``section`` (one layer's ``algorithm:``, plain values) that another built-in algorithm reads and
    ``chosen`` does not, each holding that algorithm's default: the loader drops them (verl's configs carry
    ``gamma: 1.0`` for every estimator). Set to anything else, such a key is an error naming who reads it; keys no
    algorithm reads are left for the loader to name as unknown."""
    own = {f.name for f in dataclasses.fields(chosen)}
    stray = [k for k in section if k not in own]
    if not stray:
        return []
    readers: dict[str, list[tuple[str, object]]] = {}
    for algo, cls in builtin_classes().items():
        for f in dataclasses.fields(getattr(cls, "section", AlgorithmConfig)):
            if f.name not in own and f.default is not dataclasses.MISSING:
                readers.setdefault(f.name, []).append((algo, f.default))
    dropped = []
    for key in stray:
        if key not in readers:
            continue
        if any(section[key] == default for _, default in readers[key]):
            dropped.append(key)
            continue
        raise ConfigError(
            f"config key algorithm.{key}: set, but algorithm.name={name} never reads it (only "
            f"{', '.join(a for a, _ in readers[key])} does); remove it or choose that algorithm"
        )
    return dropped
