"""Agent loops: a rollout of several model turns with tool calls between them, over any engine, in any schedule.

An agent loop decides what happens when a model turn ends (verl's ``AgentLoopBase`` does the same job with one
coroutine per sample). Loops are registered by name and chosen per dataset row (its ``agent_name`` column) or by
``rollout.agent.default_agent_loop``:

- ``single_turn_agent``: one turn (asyncrl's behaviour without tools);
- ``tool_agent``: a turn that calls tools (``rollout.multi_turn.tools``) gets their outputs and goes on; a turn
  without a call ends the rollout.

``AgentEngine`` wraps a rollout engine with the loops and has the engine's own interface (``generate``, ``resume``,
``submit``/``step``, weights, pause), so every schedule runs multi-turn rollouts without a loop of its own. In every
schedule a conversation is a small state machine on the engine's streaming interface: its turn ends (``step`` hands
the row back and its slot is free) -> ``next_turn`` runs its tool calls on the agent pool, each under its deadline,
while the engine decodes the others -> the tool's tokens appended, the row goes back into the engine's queue for its
next turn; a row whose conversation ended goes to its reward (``generate``'s ``on_samples``; fully_async's
Rollouter). A loop is asked one row at a time (``next_turns([sample], [text])``), so a loop written for batches runs
unchanged. Token in, token out: the model's tokens are kept exactly as generated, a tool's output is appended as the
chat template's tokens with response mask 0, log-prob 0 and the weight version in force, and the next turn continues
from the ids (never from re-tokenized text). A sample interrupted by a weight sync is "interrupted" like any other
and ``resume`` continues it mid-conversation.
"""

from __future__ import annotations

import dataclasses
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from asyncrl.config.errors import ConfigError
from asyncrl.named import load_named
from asyncrl.rollout.agent.format import TurnEncoder, conversation_text, parse_hermes_tool_calls, truncate
from asyncrl.rollout.agent.tools import Tool, build_tools, call_tools
from asyncrl.rollout.sampling import check_prompts
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


_OWN = frozenset(
    {
        "engine",
        "multi_turn",
        "default_agent_loop",
        "_loops",
        "_tools",
        "last_prefill",
        "last_segments",
        "_lock",
        "_pool",
    }
)


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
        self._lock = threading.Lock()  # loops, tools and the pool are built once, whichever thread asks first
        self._pool: ThreadPoolExecutor | None = None
        self.last_prefill = PrefillStats()
        self.last_segments: tuple[tuple[int, int, float], ...] = ()  # the engine's, after a single-turn call

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
        """As the engine's ``generate``; ``on_samples`` gets samples whose whole conversation ended, as they end.
        Prompts whose loops are all single-turn are one engine call; otherwise every row is a conversation of its
        own (``_converse``)."""
        if any(not isinstance(self.loop_for(p), SingleTurnAgent) for p in prompts):  # an unknown name fails here
            check_prompts(prompts, "AgentEngine")
            version = self.engine.version
            rows = [Sample.blank(p, version, j) for p in prompts for j in range(params.n)]
            return self._converse(rows, params, seed, on_samples)
        if on_samples is not None and getattr(self.engine, "reports_finished_rows", False):
            out = self.engine.generate(prompts, params, seed=seed, on_samples=on_samples)
        else:
            out = self.engine.generate(prompts, params, seed=seed)
            if on_samples is not None:
                on_samples([s for s in out if s.stop_reason != "interrupted"])
        self.last_prefill = self.engine.last_prefill
        self.last_segments = getattr(self.engine, "last_segments", ())
        return out

    def resume(self, samples: list[Sample], params: SamplingParams, seed: int | None = None) -> list[Sample]:
        """As the engine's ``resume``: interrupted samples continue, mid-turn or at the start of their next turn,
        each to the end of its conversation (``_converse``)."""
        return self._converse(list(samples), params, seed, None)

    def _converse(
        self,
        rows: list[Sample],
        params: SamplingParams,
        seed: int | None,
        on_samples: Callable[[list[Sample]], None] | None,
    ) -> list[Sample]:
        """Every "interrupted" row of ``rows`` to the end of its conversation on the engine's streaming interface,
        each on its own: a turn that ends frees the row's slot and its tool calls run on the agent pool
        (``next_turn``) while the engine decodes the others; the row re-enters with the tool's tokens appended.
        Rows come back in input order. A pause request (a weight sync) stops it between steps: the rows on the
        engine come back "interrupted" mid-turn, those whose tools run when their calls return, at the start of their
        next turn; ``resume`` goes on from there."""
        engine, out = self.engine, list(rows)
        where: dict[tuple[int, int], int] = {}
        for i, s in enumerate(rows):
            if (id(s.prompt), s.row) in where:  # a prompt twice in one call: each row keeps its own place
                s = out[i] = dataclasses.replace(s, prompt=dataclasses.replace(s.prompt))
            where[id(s.prompt), s.row] = i
            self.loop_for(s.prompt)
        turns: dict[Future[Sample], int] = {}
        self.last_segments = ()
        engine.submit([s for s in out if s.stop_reason == "interrupted"], params, seed)
        try:
            while (engine.live_rows() or turns) and not engine.pause_requested:
                ended: list[Sample] = []
                for s in engine.step() if engine.live_rows() else ():
                    if self.multi_turn_row(s):
                        turns[self.turn_pool().submit(self.next_turn, s, params)] = where[id(s.prompt), s.row]
                    else:
                        out[where[id(s.prompt), s.row]] = s
                        ended.append(s)
                if turns and not engine.live_rows():
                    wait(turns, return_when=FIRST_COMPLETED)
                again = self._returned(turns, out, ended)
                engine.submit(again, params, seed)
                if on_samples is not None and ended:
                    on_samples(ended)
        finally:
            for s in engine.interrupt():
                out[where[id(s.prompt), s.row]] = s
        if turns:  # paused: the turns running end, their rows wait at the start of their next turn
            wait(turns)
            ended = []
            self._returned(turns, out, ended)
            if on_samples is not None and ended:
                on_samples(ended)
        self.last_prefill = engine.take_prefill()
        return out

    def _returned(self, turns: dict[Future[Sample], int], out: list[Sample], ended: list[Sample]) -> list[Sample]:
        """Take the turns that returned off ``turns`` into ``out``: the rows whose next turn decodes (returned),
        the conversations that ended (added to ``ended``). A loop's or tool's error is raised here."""
        again: list[Sample] = []
        for f in [f for f in turns if f.done()]:
            s = out[turns.pop(f)] = f.result()
            (again if s.stop_reason == "interrupted" else ended).append(s)
        return again

    def turn_pool(self) -> ThreadPoolExecutor:
        """The agent pool: ``rollout.multi_turn.max_concurrent_turns`` threads running conversations' turns."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.multi_turn.max_concurrent_turns, thread_name_prefix="agent-turn")
            return self._pool

    # ---- streaming (``asyncrl.rollout.streaming``; fully_async's Rollouter) ------------------------------------------
    # ``step``, ``interrupt``, ``drain`` and ``live_rows`` are the engine's: ``step`` returns the rows whose turn
    # ended; what follows a turn is ``next_turn``'s, off the decode (a row waiting for its tool holds no slot).
    def submit(self, rows: list[Sample], params: SamplingParams, seed: int | None = None) -> None:
        """As the engine's: the rows (blank, partial, or at the start of a turn after a tool's output) enter at its
        next step."""
        for s in rows:
            self.loop_for(s.prompt)  # an unknown agent_name fails here, not mid-stream
        self.engine.submit(rows, params, seed)

    def multi_turn_row(self, sample: Sample) -> bool:
        """Whether a row that ended goes through ``next_turn`` (its loop may go on, or its text is a conversation's)."""
        return not self._single_turn(sample)

    def next_turn(self, sample: Sample, params: SamplingParams) -> Sample:
        """What follows one row's ended turn (blocking: the tool calls run here, each under its deadline): the row
        "interrupted" with the tool's output appended, to decode its next turn, or the row ended with its
        conversation's text. Thread-safe: rows' turns run at once on a pool. The row's loop is asked about this row
        alone (``next_turns([sample], [text])``)."""
        s, loop = sample, self.loop_for(sample.prompt)
        limit = self.multi_turn.max_assistant_turns
        if s.stop_reason == "eos":
            if s.response_mask is None and not isinstance(loop, SingleTurnAgent):
                s = dataclasses.replace(s, response_mask=[1] * len(s.response_ids))  # a multi-turn sample
            [c] = loop.next_turns([s], [self._last_turn_text(s)]) if limit is None or s.turns < limit else [None]
            if c is not None:
                s = dataclasses.replace(
                    s, tool_calls=s.tool_calls + c.tool_calls, tool_errors=s.tool_errors + c.tool_errors
                )
                if len(s.response_ids) + len(c.tokens) < params.max_new_tokens:
                    return self._append(s, c.tokens)
                s = dataclasses.replace(s, stop_reason="length")  # no room for another turn
        if s.response_mask is not None:
            s.response_text = conversation_text(self.engine.tokenizer, s)
        return s

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
