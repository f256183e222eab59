"""How a config section checks itself, next to its fields: ``RULES`` maps a field to a rule (a test and the words for
what is allowed), and a section with relations between its own fields adds them in its ``check``. A rule that fails
raises the one error every config problem raises: ``config key <key> must be <allowed> (got <value>)``. What spans
sections (a key the chosen algorithm or schedule never reads, one section's value bounding another's) is
``asyncrl.config.checks``'s."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from asyncrl.config.errors import check

Rule = tuple[Callable[[Any], bool], str]


def rule(ok: Callable[[Any], bool], allowed: str) -> Rule:
    return ok, allowed


def at_least(lo: float, note: str = "") -> Rule:
    return (lambda v: v >= lo), f">= {lo:g}{note}"


def between(lo: float, hi: float) -> Rule:
    return (lambda v: lo <= v <= hi), f"in [{lo:g}, {hi:g}]"


def one_of(choices: Sequence[Any]) -> Rule:
    return (lambda v: v in choices), "one of " + ", ".join(str(c) for c in choices)


def or_null(r: Rule) -> Rule:
    ok, allowed = r
    return (lambda v: v is None or ok(v)), f"{allowed} or null"


POSITIVE_INT = at_least(1)
POSITIVE = rule(lambda v: v > 0, "> 0")
NON_NEGATIVE = at_least(0)


class Checked:
    """A config section that checks its own fields (``RULES``) and, recursively, its subsections."""

    RULES: ClassVar[dict[str, Rule]] = {}

    def check(self, key: str) -> None:
        for name, (ok, allowed) in self.RULES.items():
            value = getattr(self, name)
            check(ok(value), f"{key}.{name}", value, allowed)
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, Checked):
                value.check(f"{key}.{f.name}")
