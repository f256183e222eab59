"""Tools with a fixed latency for ``asyncrl bench --tool-delay-ms``: ``calc`` that waits before it answers.

A user's tool is named in ``rollout.multi_turn.tools`` as ``"package.module:ClassName"`` and built with no arguments,
so the delay lives in the name: ``asyncrl_lab.bench_tools:calc_delay_200ms`` is a ``calc`` that first sleeps 200 ms
(``asyncio.sleep`` on the agent's event loop: the calls of one turn wait together, as calls to a remote tool would)
and then answers exactly as the built-in one. It reports the name ``calc`` and calc's schema, so the prompts (which
render the tools' schemas) are the same as with the built-in tool and a model SFT-trained to call ``calc`` reaches it.
The classes are made on first use by the module's ``__getattr__`` and cached, so a Ray worker that imports the name
builds the same tool as the driver.
"""

from __future__ import annotations

import asyncio
import re
from functools import cache
from typing import Any, ClassVar

from asyncrl.rollout.agent.tools import CalcTool

_DELAYED_NAME = re.compile(r"calc_delay_(\d+)ms")


class DelayedCalcTool(CalcTool):
    """``calc`` after ``delay_s`` seconds; the delay counts against ``rollout.multi_turn.tool_timeout_s`` as a real
    tool's latency would."""

    delay_s: ClassVar[float] = 0.0

    async def call(self, arguments: dict[str, Any]) -> str:
        await asyncio.sleep(self.delay_s)
        return await super().call(arguments)


@cache
def delayed_calc(delay_ms: int) -> type[DelayedCalcTool]:
    """The class ``calc_delay_<delay_ms>ms`` (one per delay, so every lookup of a name returns the same class)."""
    if delay_ms < 0:
        raise ValueError(f"bench tool delay must be >= 0 ms (got {delay_ms})")
    name = f"calc_delay_{delay_ms}ms"
    attrs = {"delay_s": delay_ms / 1000.0, "__module__": __name__, "__qualname__": name}
    return type(name, (DelayedCalcTool,), attrs)


def tool_spec(delay_ms: int) -> str:
    """The ``rollout.multi_turn.tools`` entry of ``calc`` answering after ``delay_ms`` (0: the built-in ``calc``)."""
    delayed_calc(delay_ms)  # a bad delay fails here, in the driver, not in a rollout worker
    return "calc" if delay_ms == 0 else f"{__name__}:calc_delay_{delay_ms}ms"


def __getattr__(name: str) -> type[DelayedCalcTool]:
    match = _DELAYED_NAME.fullmatch(name)
    if match is None:
        raise AttributeError(
            f"module {__name__!r} has no attribute {name!r} (delayed tools are named calc_delay_<ms>ms, "
            "e.g. calc_delay_200ms)"
        )
    return delayed_calc(int(match.group(1)))
