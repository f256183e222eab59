"""Agent loops: what follows a model turn that ended, per row, in a multi-turn rollout; registered by name, chosen per
row (``agent_name``) or by ``rollout.agent.default_agent_loop`` (docs/agent_loop.md, "Choosing the loop"). A loop
answers with a ``Continuation`` or None (the conversation ends); ``agent.engine.AgentEngine`` runs the loops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from asyncrl.config.errors import ConfigError
from asyncrl.named import load_named
from asyncrl.rollout.agent.format import TurnEncoder, parse_hermes_tool_calls, truncate
from asyncrl.rollout.agent.tools import Tool, call_each, run_to_completion
from asyncrl.types import Sample

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from asyncrl.config.rollout import MultiTurnConfig


@dataclass(frozen=True)
class Continuation:
    """What follows an ended turn: ``tokens`` appended with mask 0 before the model's next turn, and the tool calls
    (and failed ones) they answer."""

    tokens: list[int]
    tool_calls: int = 0
    tool_errors: int = 0


@dataclass
class AgentContext:
    """What a loop may use: the tokenizer, ``rollout.multi_turn`` and the built tools by name."""

    tokenizer: PreTrainedTokenizerBase
    multi_turn: MultiTurnConfig
    tools: dict[str, Tool]


class AgentLoop:
    """What follows a turn that ended: define ``next_turn_async`` (one row, awaited on the agent's event loop, as
    verl's agent loops and tools are coroutines) or ``next_turns`` (rows in a batch, blocking: run on the agent pool,
    one row a thread)."""

    name: ClassVar[str] = ""

    def __init__(self, ctx: AgentContext):
        self.ctx = ctx

    def next_turns(self, samples: list[Sample], turn_texts: list[str]) -> list[Continuation | None]:
        """For each sample whose last turn ended (eos; ``turn_texts[i]`` is that turn's text): the continuation, or
        None to end its rollout. By default ``next_turn_async`` of each, at once."""

        async def each() -> list[Continuation | None]:
            return list(await asyncio.gather(*(self.next_turn_async(s, t) for s, t in zip(samples, turn_texts))))

        return run_to_completion(each())

    async def next_turn_async(self, sample: Sample, turn_text: str) -> Continuation | None:
        """One row's continuation, or None to end its rollout, awaited on the agent's event loop beside every other
        row's turn: it awaits what it waits for (tools, HTTP) and never blocks the loop."""
        raise NotImplementedError(f"{type(self).__name__} defines neither next_turns nor next_turn_async")

    @classmethod
    def awaits(cls) -> bool:
        """Whether the loop's turns are coroutines (``next_turn_async``), run on the agent's event loop."""
        return cls.next_turn_async is not AgentLoop.next_turn_async


AGENT_LOOPS: dict[str, type[AgentLoop]] = {}


def register_agent_loop(name: str) -> Callable[[type[AgentLoop]], type[AgentLoop]]:
    """Class decorator: make an ``AgentLoop`` subclass available as ``agent_name`` / ``default_agent_loop``."""

    def deco(cls: type[AgentLoop]) -> type[AgentLoop]:
        if name in AGENT_LOOPS and AGENT_LOOPS[name] is not cls:
            raise ValueError(f"agent loop {name!r} is already registered ({AGENT_LOOPS[name].__name__})")
        cls.name = name
        AGENT_LOOPS[name] = cls
        return cls

    return deco


@register_agent_loop("single_turn_agent")
class SingleTurnAgent(AgentLoop):
    def next_turns(self, samples: list[Sample], turn_texts: list[str]) -> list[Continuation | None]:
        return [None] * len(samples)


@register_agent_loop("tool_agent")
class ToolAgent(AgentLoop):
    def __init__(self, ctx: AgentContext):
        super().__init__(ctx)
        if not ctx.tools:
            raise ValueError("the tool_agent loop needs tools: set rollout.multi_turn.tools (e.g. [calc])")
        self.encoder = TurnEncoder(ctx.tokenizer)

    async def next_turn_async(self, sample: Sample, turn_text: str) -> Continuation | None:
        calls = parse_hermes_tool_calls(turn_text)
        if not calls:
            return None
        mt = self.ctx.multi_turn
        res = await call_each(self.ctx.tools, calls, mt.tool_timeout_s)
        texts = [truncate(r.text, mt.max_tool_response_length, mt.tool_response_truncate_side) for r in res]
        return Continuation(self.encoder.encode(texts), len(res), sum(not r.ok for r in res))


def agent_loop_class(name: str) -> type[AgentLoop]:
    """A registered loop's class, or an ``AgentLoop`` subclass of the user's named ``"path/to/file.py:ClassName"``
    or ``"package.module:ClassName"`` (as a custom reward function is): imported where the engine runs, so a loop of
    one's own reaches Ray workers without registering there. ``ValueError`` names what is wrong."""
    cls = AGENT_LOOPS.get(name)
    if cls is None and ":" not in name:
        raise ValueError(
            f"{name!r} is not a registered agent loop (registered: {', '.join(sorted(AGENT_LOOPS))}; "
            "or 'path/to/file.py:ClassName' for an AgentLoop subclass)"
        )
    if cls is None:
        cls = load_named(name, "agent loop", kind="class")
    if not (isinstance(cls, type) and issubclass(cls, AgentLoop)):
        raise ValueError(f"agent loop {name!r} is not a subclass of asyncrl.rollout.agent.loop.AgentLoop")
    if not cls.awaits() and cls.next_turns is AgentLoop.next_turns:
        raise ValueError(f"agent loop {name!r} defines neither next_turns nor next_turn_async")
    return cls


def check_agent_loop(name: str) -> None:
    """``rollout.agent.default_agent_loop`` names a loop (a run checks it before any worker starts)."""
    try:
        agent_loop_class(name)
    except ValueError as e:
        raise ConfigError(f"config key rollout.agent.default_agent_loop: {e}") from None
