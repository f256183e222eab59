"""Agent loops: a rollout of several model turns with tool calls between them, over any engine, in any schedule.

An agent loop decides what happens when a model turn ends (verl's ``AgentLoopBase`` does the same job with one
coroutine per sample; here a loop decides for a whole batch of ended turns at once, so the engine keeps decoding in
batches and one turn's tool calls run concurrently). Loops are registered by name and chosen per dataset row (its
``agent_name`` column) or by ``rollout.agent.default_agent_loop``:

- ``single_turn_agent``: one turn (asyncrl's behaviour without tools);
- ``tool_agent``: a turn that calls tools (``rollout.multi_turn.tools``) gets their outputs and goes on; a turn
  without a call ends the rollout.

``AgentEngine`` wraps a rollout engine with the loops and has the engine's own interface (``generate``, ``resume``,
weights, pause), so every schedule, the Rollouter's partial rollout included, runs multi-turn rollouts without a
loop of its own. Streaming (``fully_async``), a row is a small state machine: its turn ends (``step`` hands it back
and its slot is free) -> ``next_turn`` runs its tool calls on the Rollouter's agent pool, each under its deadline,
while the engine decodes the others -> the tool's tokens appended, the row goes back into an engine's queue for its
next turn; a row whose conversation ended goes to its reward. A loop is asked one row at a time there
(``next_turns([sample], [text])``), so a loop written for batches runs unchanged. Token in, token out: the model's
tokens are kept exactly as generated, a tool's output is appended as the chat template's tokens with response mask
0, log-prob 0 and the weight version in force, and the next turn
continues from the ids (never from re-tokenized text). A sample interrupted by a weight sync is "interrupted" like
any other and ``resume`` continues it mid-conversation.
"""

from __future__ import annotations

import dataclasses
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from asyncrl.config.errors import ConfigError
from asyncrl.named import load_named
from asyncrl.rollout.agent.format import TurnEncoder, parse_hermes_tool_calls, truncate
from asyncrl.rollout.agent.tools import Tool, build_tools, call_tools
from asyncrl.types import PrefillStats, Prompt, Sample, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from asyncrl.config.rollout import MultiTurnConfig
    from asyncrl.rollout.engine import RolloutEngine
    from asyncrl.rollout.vllm_engine import VllmEngine


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


class AgentLoop(ABC):
    name: ClassVar[str] = ""

    def __init__(self, ctx: AgentContext):
        self.ctx = ctx

    @abstractmethod
    def next_turns(self, samples: list[Sample], turn_texts: list[str]) -> list[Continuation | None]:
        """For each sample whose last turn ended (eos; ``turn_texts[i]`` is that turn's text): the continuation, or
        None to end its rollout."""


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

    def next_turns(self, samples: list[Sample], turn_texts: list[str]) -> list[Continuation | None]:
        calls = [parse_hermes_tool_calls(t) for t in turn_texts]
        with_calls = [i for i, c in enumerate(calls) if c]
        mt = self.ctx.multi_turn
        results = call_tools(self.ctx.tools, [calls[i] for i in with_calls], mt.tool_timeout_s)
        out: list[Continuation | None] = [None] * len(samples)
        for i, res in zip(with_calls, results):
            texts = [truncate(r.text, mt.max_tool_response_length, mt.tool_response_truncate_side) for r in res]
            out[i] = Continuation(self.encoder.encode(texts), len(res), sum(not r.ok for r in res))
        return out


def agent_loop_class(name: str) -> type[AgentLoop]:
    """A registered loop's class, or an ``AgentLoop`` subclass of the user's named ``"path/to/file.py:ClassName"``
    or ``"package.module:ClassName"`` (as a custom reward function is): imported where the engine runs, so a loop of
    one's own reaches Ray workers without registering there. ``ValueError`` names what is wrong."""
    if name in AGENT_LOOPS:
        return AGENT_LOOPS[name]
    if ":" not in name:
        raise ValueError(
            f"{name!r} is not a registered agent loop (registered: {', '.join(sorted(AGENT_LOOPS))}; "
            "or 'path/to/file.py:ClassName' for an AgentLoop subclass)"
        )
    cls = load_named(name, "agent loop", kind="class")
    if not (isinstance(cls, type) and issubclass(cls, AgentLoop)):
        raise ValueError(f"agent loop {name!r} is not a subclass of asyncrl.rollout.agent.loop.AgentLoop")
    return cls


def check_agent_loop(name: str) -> None:
    """``rollout.agent.default_agent_loop`` names a loop (a run checks it before any worker starts)."""
    try:
        agent_loop_class(name)
    except ValueError as e:
        raise ConfigError(f"config key rollout.agent.default_agent_loop: {e}") from None


_OWN = frozenset({"engine", "multi_turn", "default_agent_loop", "_loops", "_tools", "last_prefill", "_lock"})


class AgentEngine:
    """A rollout engine whose samples may be several turns long; see the module docstring.

    Everything not defined here (weights, pause, model, tokenizer, ...) is the wrapped engine's.
    """

    reports_finished_rows = True

    def __init__(
        self,
        engine: RolloutEngine | VllmEngine,
        multi_turn: MultiTurnConfig,
        default_agent_loop: str = "single_turn_agent",
    ):
        self.engine = engine
        self.multi_turn = multi_turn
        self.default_agent_loop = default_agent_loop
        self._loops: dict[str, AgentLoop] = {}
        self._tools: dict[str, Tool] | None = None
        self._lock = threading.Lock()  # loops and tools are built once, whichever thread asks first
        self.last_prefill = PrefillStats()

    def __getattr__(self, name: str) -> Any:  # only for what this class does not define
        if name == "engine":
            raise AttributeError(name)
        return getattr(self.engine, name)

    def __setattr__(self, name: str, value: object) -> None:
        """Own state and properties here; anything else (``eos_token_ids``, ...) is set on the wrapped engine, so
        the wrapper never shadows what the engine reads."""
        if name in _OWN or isinstance(getattr(type(self), name, None), property):
            object.__setattr__(self, name, value)
        else:
            setattr(self.engine, name, value)

    @property
    def version(self) -> int:
        return self.engine.version

    @version.setter
    def version(self, value: int) -> None:
        self.engine.version = value

    # ---- which loop ------------------------------------------------------------------------------------------------
    def loop_for(self, prompt: Prompt) -> AgentLoop:
        name = prompt.agent_name or self.default_agent_loop
        loop = self._loops.get(name)
        if loop is not None:
            return loop
        with self._lock:
            return self._build_loop(name, prompt)

    def _build_loop(self, name: str, prompt: Prompt) -> AgentLoop:
        loop = self._loops.get(name)
        if loop is None:
            try:
                cls = agent_loop_class(name)
            except ValueError as e:
                raise ValueError(f"prompt index {prompt.index}: agent_name {e}") from None
            if self._tools is None:
                self._tools = build_tools(list(self.multi_turn.tools))
            loop = self._loops[name] = cls(AgentContext(self.engine.tokenizer, self.multi_turn, self._tools))
        return loop

    def _single_turn(self, sample: Sample) -> bool:
        return isinstance(self.loop_for(sample.prompt), SingleTurnAgent)

    # ---- the engine interface --------------------------------------------------------------------------------------
    def generate(
        self,
        prompts: list[Prompt],
        params: SamplingParams,
        seed: int | None = None,
        on_samples: Callable[[list[Sample]], None] | None = None,
    ) -> list[Sample]:
        """As the engine's ``generate``; ``on_samples`` gets samples whose whole conversation has ended: single-turn
        rows as the engine reports them (a decode step's at once), the others when the call returns."""
        for p in prompts:
            self.loop_for(p)  # an unknown agent_name fails before any decoding
        reported: set[int] = set()

        def early(ended: list[Sample]) -> None:  # single-turn rows that ended: report them while the others decode
            done = [s for s in ended if self._single_turn(s)]
            reported.update(map(id, done))
            if done:
                on_samples(done)  # type: ignore[misc]

        streams = on_samples is not None and getattr(self.engine, "reports_finished_rows", False)
        if streams:
            first = self.engine.generate(prompts, params, seed=seed, on_samples=early)
        else:
            first = self.engine.generate(prompts, params, seed=seed)
        self.last_prefill = self.engine.last_prefill
        out = self._converse(list(first), set(range(len(first))), params, seed, None)
        rest = [s for s in out if s.stop_reason != "interrupted" and id(s) not in reported]
        if on_samples is not None and rest:
            on_samples(rest)
        return out

    def resume(
        self,
        samples: list[Sample],
        params: SamplingParams,
        seed: int | None = None,
        refill: Callable[[int], bool] | None = None,
    ) -> list[Sample]:
        """As the engine's ``resume``: interrupted samples continue, mid-turn or at the start of their next turn."""
        live = {i for i, s in enumerate(samples) if s.stop_reason == "interrupted"}
        for i in live:
            self.loop_for(samples[i].prompt)
        first = self.engine.resume(samples, params, seed=seed, refill=refill)
        self.last_prefill = self.engine.last_prefill
        return self._converse(list(first), live, params, seed, refill)

    # ---- streaming (``asyncrl.rollout.streaming``; fully_async's Rollouter) ------------------------------------------
    def submit(self, rows: list[Sample], params: SamplingParams, seed: int | None = None) -> None:
        """As the engine's: the rows (blank, partial, or at the start of a turn after a tool's output) enter at its
        next step."""
        for s in rows:
            self.loop_for(s.prompt)  # an unknown agent_name fails here, not mid-stream
        self.engine.submit(rows, params, seed)

    def step(self) -> list[Sample]:
        """One engine step; returns the rows whose turn ended. What follows a turn (a tool call and the next turn,
        or the end of the conversation) is ``next_turn``'s, which the Rollouter runs off the decode: a row waiting
        for its tool holds no slot."""
        return self.engine.step()

    def interrupt(self) -> list[Sample]:
        """Every row the engine holds, partial (mid-turn, or at the start of a turn with a tool's output appended)."""
        return self.engine.interrupt()

    def drain(self) -> list[Sample]:
        """Steps until no row decodes; returns the rows whose turn ended."""
        out: list[Sample] = []
        while self.engine.live_rows():
            out += self.step()
        return out

    def multi_turn_row(self, sample: Sample) -> bool:
        """Whether a row that ended goes through ``next_turn`` (its loop may go on, or its text is a conversation's)."""
        return not self._single_turn(sample)

    def next_turn(self, sample: Sample, params: SamplingParams) -> Sample:
        """What follows one row's ended turn (blocking: the tool calls run here, each under its deadline): the row
        "interrupted" with the tool's output appended, to decode its next turn, or the row ended with its
        conversation's text. Thread-safe: rows' turns run at once on a pool."""
        out = [sample]
        if self._decide(out, [0] if sample.stop_reason == "eos" else [], params):
            return out[0]
        s = out[0]
        if s.response_mask is not None:
            s.response_text = conversation_text(self.engine.tokenizer, s)
        return s

    def _converse(
        self,
        out: list[Sample],
        fresh: set[int],
        params: SamplingParams,
        seed: int | None,
        refill: Callable[[int], bool] | None,
    ) -> list[Sample]:
        """Run the loops on the turns that just ended (``fresh``), continue those that go on, until none does or
        the engine is paused (then they stay "interrupted", tool outputs already appended)."""
        while True:
            going = self._decide(out, sorted(i for i in fresh if out[i].stop_reason == "eos"), params)
            if not going:
                for i in fresh:
                    if out[i].response_mask is not None:
                        out[i].response_text = conversation_text(self.engine.tokenizer, out[i])
                return out
            cont = self.engine.resume([out[i] for i in going], params, seed=seed, refill=refill)
            self.last_prefill = self.last_prefill + self.engine.last_prefill
            for i, s in zip(going, cont):
                out[i] = s
            fresh = set(going)

    def _decide(self, out: list[Sample], ended: list[int], params: SamplingParams) -> list[int]:
        """Ask each ended sample's loop what follows; append the continuations that fit. Returns the samples that go
        on (now "interrupted")."""
        by_loop: dict[str, list[int]] = {}
        limit = self.multi_turn.max_assistant_turns
        for i in ended:
            if out[i].response_mask is None and not self._single_turn(out[i]):
                out[i].response_mask = [1] * len(out[i].response_ids)  # marks a multi-turn sample (agent_metrics)
            if limit is None or out[i].turns < limit:
                by_loop.setdefault(out[i].prompt.agent_name or self.default_agent_loop, []).append(i)
        going: list[int] = []
        for idx in by_loop.values():
            texts = [self._last_turn_text(out[i]) for i in idx]
            for i, c in zip(idx, self.loop_for(out[idx[0]].prompt).next_turns([out[i] for i in idx], texts)):
                if c is None:
                    continue
                s = out[i]
                counted = dataclasses.replace(
                    s, tool_calls=s.tool_calls + c.tool_calls, tool_errors=s.tool_errors + c.tool_errors
                )
                if len(s.response_ids) + len(c.tokens) >= params.max_new_tokens:
                    out[i] = dataclasses.replace(counted, stop_reason="length")  # no room for another turn
                    continue
                out[i] = self._append(counted, c.tokens)
                going.append(i)
        return going

    def _append(self, s: Sample, tokens: list[int]) -> Sample:
        ids = s.response_ids + tokens
        return dataclasses.replace(
            s,
            response_ids=ids,
            logprobs=s.logprobs + [0.0] * len(tokens),
            versions=s.versions + [self.engine.version] * len(tokens),
            response_mask=s.loss_mask + [0] * len(tokens),
            stop_reason="interrupted",
            turns=s.turns + 1,
            reward=0.0,
            reward_failed=False,
            reward_extra={},
        )

    def _last_turn_text(self, s: Sample) -> str:
        """The text of the model's last turn: the trailing run of its own tokens (mask 1; no mask: one turn, all)."""
        start, mask = 0, s.response_mask
        if mask is not None:
            start = len(mask)
            while start > 0 and mask[start - 1] == 1:
                start -= 1
        return self.engine.tokenizer.decode(s.response_ids[start:], skip_special_tokens=False)


def conversation_text(tokenizer: PreTrainedTokenizerBase, sample: Sample) -> str:
    """A multi-turn response as the reward sees it: each run of the model's tokens and each tool turn decoded on its
    own (special tokens skipped) and joined by newlines, so the final answer is the last line whatever the chat
    template puts between turns."""
    parts, start, mask = [], 0, sample.loss_mask
    for k in range(1, len(mask) + 1):
        if k == len(mask) or mask[k] != mask[start]:
            parts.append(tokenizer.decode(sample.response_ids[start:k], skip_special_tokens=True).strip())
            start = k
    return "\n".join(p for p in parts if p)
