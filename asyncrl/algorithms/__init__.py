"""One module per algorithm (``algorithm.name``): the roles it needs, how finished samples become a typed training
batch, and which pure losses from ``asyncrl.losses`` update which role. Every algorithm runs on every schedule."""

from __future__ import annotations

import importlib

from asyncrl.algorithms.base import Algorithm, Finish, Prepared, Trained
from asyncrl.config import Config, ConfigError


def algorithm_class(cfg: Config) -> type[Algorithm]:
    """The class of ``algorithm.name``: the module ``asyncrl.algorithms.<name>`` for a built-in name, or the module at
    a dotted import path of the user's (``my_pkg.my_algo``), names it ``ALGORITHM`` (imported on demand:
    distillation's teacher client is not loaded otherwise). A new algorithm is such a module and its loss: nothing
    here lists it."""
    name = cfg.algorithm.name
    module_name = name if "." in name else f"asyncrl.algorithms.{name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is None or not module_name.startswith(e.name):
            raise  # the module exists; something it imports does not
        raise ConfigError(f"config key algorithm.name={name!r}: no module {module_name} to import") from None
    cls = getattr(module, "ALGORITHM", None)
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ConfigError(
            f"config key algorithm.name={name!r}: module {module_name} must name its asyncrl.algorithms.Algorithm "
            f"subclass ALGORITHM (got {cls!r:.60})"
        )
    return cls


__all__ = ["Algorithm", "Finish", "Prepared", "Trained", "algorithm_class"]
