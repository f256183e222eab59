"""The one error type of the config, and the check every section uses."""

from __future__ import annotations

from asyncrl.errors import UserInputError


class ConfigError(UserInputError, ValueError):
    """A config problem, always naming the key (``rollout.n``), the value and what is allowed."""


def check(ok: bool, key: str, value: object, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"config key {key} must be {allowed} (got {value!r})")
