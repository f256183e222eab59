"""Loading: a YAML file and dotted ``key=value`` overrides merged onto the dataclass defaults with OmegaConf.

An unknown key, a wrong type or a key that was renamed fails here, naming the key, before any worker starts; range
and consistency checks follow in ``asyncrl.config.checks``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from asyncrl.config import algorithm_section
from asyncrl.config.checks import validate
from asyncrl.config.errors import ConfigError
from asyncrl.config.schema import Config

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from omegaconf import Container, DictConfig, ListConfig

T = TypeVar("T", bound="DataclassInstance")

# Keys that were replaced: the one-line message a config that still uses them gets.
RENAMED = {
    "trainer.mode": "trainer.mode was split into algorithm.name (grpo | ppo | distill) and trainer.schedule "
    "(sync | one_step_off | two_step_off | fully_async): mode=ppo -> algorithm.name=ppo, mode=distill -> "
    "algorithm.name=distill, mode=sync|one_step_off|fully_async -> trainer.schedule=<the same>",
    "trainer.scheduler": "trainer.scheduler was replaced by trainer.schedule (serial -> sync; one_step_off and "
    "two_step_off keep their names) and now applies to every algorithm",
    "sync": "sync (the section of the trainer -> rollout weight sync) was renamed weight_sync: "
    "sync.bucket_mb -> weight_sync.bucket_mb, sync.verify -> weight_sync.verify, sync.timeout_s -> "
    "weight_sync.timeout_s; its metrics are weight_sync/*",
}


def load_config(
    path: str | Path | Mapping[str, object] | None = None,
    overrides: list[str] | None = None,
    validate_fn: Callable[[Config], None] = validate,
) -> Config:
    """The run's ``Config``: ``load_schema`` of the config tree, checked by ``validate_fn`` (the run's checks)."""
    return load_schema(Config, path, overrides, validate_fn)


def load_schema(
    schema: type[T],
    path: str | Path | Mapping[str, object] | None,
    overrides: list[str] | None,
    validate_fn: Callable[[T], None],
) -> T:
    """Merge a YAML file (or a nested dict of the same keys) and ``key=value`` overrides onto the dataclass defaults
    and validate; raises ``ConfigError`` naming the key for an unknown key, a wrong type, a missing or an out-of-range
    value."""
    from omegaconf import OmegaConf  # here, not at import: the config tree itself needs no omegaconf
    from omegaconf.errors import OmegaConfBaseException

    layers: list[tuple[str, DictConfig | ListConfig]] = []
    if isinstance(path, Mapping):
        try:
            layers.append(("config dict", OmegaConf.create(dict(path))))
        except OmegaConfBaseException as e:
            raise ConfigError(f"config dict: {str(e).splitlines()[0]}") from None
    elif path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p}: no such file")
        try:
            layers.append((str(p), OmegaConf.load(p)))
        except Exception as e:  # yaml syntax errors
            raise ConfigError(f"config file {p}: not valid YAML: {e}") from None
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"command-line override {item!r}: expected key=value (e.g. rollout.n=8)")
        # ``+key=value`` / ``++key=value`` as ``key=value``: verl's scripts add keys its YAML lacks with Hydra's ``+``
        # (``+reward_model.reward_kwargs.max_resp_len=...``); every key exists in this tree, so adding and setting are
        # one, and a key the tree does not have is still an unknown key
        plain = item.removeprefix("+").removeprefix("+")
        try:
            layers.append((f"override {item!r}", OmegaConf.from_dotlist([plain])))
        except Exception as e:  # the value is parsed as YAML: an unbalanced brace or quote fails there
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConfigError(
                f"command-line override {item!r}: the value is not valid YAML ({first}); quote it: key='value'"
            ) from None
    merged: Container = _base(schema, layers)
    for where, layer in layers:
        for key, message in RENAMED.items():
            if OmegaConf.select(layer, key, default=None) is not None:
                raise ConfigError(f"{where}: config key {message}")
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as e:
            raise ConfigError(_describe(e, where)) from None
    try:
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise ConfigError(_describe(e, "config")) from None
    validate_fn(cfg)
    return cfg


def _base(schema: type[T], layers: list[tuple[str, DictConfig | ListConfig]]) -> DictConfig:
    """``schema``'s defaults, its ``algorithm:`` section as the class of the algorithm the layers choose (the last
    ``algorithm.name`` set: ``algorithm_section``), and each layer's keys of other algorithms at their defaults
    removed from it."""
    from omegaconf import DictConfig, OmegaConf

    base = OmegaConf.structured(schema)
    fields = {f.name: f for f in dataclasses.fields(schema)}
    if "algorithm" not in fields:
        return base
    name = fields["algorithm"].default_factory().name  # type: ignore[misc]
    for _, layer in layers:
        set_name = OmegaConf.select(layer, "algorithm.name", default=None)
        name = str(set_name) if set_name is not None else name
    section = algorithm_section.section_class(name)
    base.algorithm = OmegaConf.structured(section)
    for _, layer in layers:
        given = OmegaConf.select(layer, "algorithm", default=None)
        if isinstance(given, DictConfig):
            plain = OmegaConf.to_container(given, resolve=False)
            for key in algorithm_section.other_algorithms_defaults(plain, section, name):  # type: ignore[arg-type]
                del given[key]
    return base


def _describe(e: Exception, where: str) -> str:
    key = getattr(e, "full_key", None) or "?"
    msg = str(e).splitlines()[0]
    if "not in" in msg or "Key '" in msg and "not" in msg:
        return f"{where}: unknown config key {key!r}"
    if "missing mandatory value" in msg.lower():
        return f"config key {key} is required (got no value)"
    return f"{where}: config key {key}: {msg}"


def to_dict(cfg: DataclassInstance) -> dict:
    return dataclasses.asdict(cfg)
