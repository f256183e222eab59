"""One module per algorithm (``algorithm.name``): the roles it needs, how finished samples become a typed training
batch, and which pure losses from ``asyncrl.losses`` update which role. Every algorithm runs on every schedule."""

from __future__ import annotations

import importlib

from asyncrl.algorithms.base import Algorithm, Finish, Prepared, Trained
from asyncrl.config import Config


def algorithm_class(cfg: Config) -> type[Algorithm]:
    """The class of ``algorithm.name``: module ``asyncrl.algorithms.<name>`` names it ``ALGORITHM`` (imported on
    demand: distillation's teacher client is not loaded otherwise). A new algorithm is a module here, its loss, and
    its name in ``asyncrl.config.schema.ALGORITHMS``."""
    name = cfg.algorithm.name
    try:
        module = importlib.import_module(f"asyncrl.algorithms.{name}")
    except ModuleNotFoundError as e:
        raise ValueError(f"algorithm.name={name!r}: no module asyncrl.algorithms.{name}") from e
    return module.ALGORITHM


__all__ = ["Algorithm", "Finish", "Prepared", "Trained", "algorithm_class"]
