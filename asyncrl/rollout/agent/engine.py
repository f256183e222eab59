"""``AgentEngine``: a rollout engine whose samples may be several turns long, over any engine, in any schedule.

It wraps a rollout engine with the agent loops (``asyncrl.rollout.agent.loop``) behind the engine's own interface, and
runs each conversation as a row of the engine's streaming interface: a turn that ends frees its slot, ``start_turn``
asks the row's loop what follows off the decode, and the row re-enters with the tool's tokens appended. The states,
token in / token out and partial rollout: docs/agent_loop.md, "A tool call releases its slot (every schedule)".
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

from asyncrl.rollout.agent.format import conversation_text
from asyncrl.rollout.agent.loop import AgentContext, AgentLoop, Continuation, SingleTurnAgent, agent_loop_class
from asyncrl.rollout.agent.tools import Tool, build_tools
from asyncrl.rollout.sampling import check_prompts
from asyncrl.types import PrefillStats, Prompt, Sample, SamplingParams

if TYPE_CHECKING:
    from asyncrl.config.rollout import MultiTurnConfig
    from asyncrl.rollout.engine import RolloutEngine
    from asyncrl.rollout.vllm_engine import VllmEngine

_OWN = frozenset({"engine", "multi_turn", "default_agent_loop", "last_prefill", "last_segments"})


class AgentEngine:
    """A rollout engine whose samples may be several turns long; what it does not define is the wrapped engine's."""

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
        self._lock = threading.Lock()  # loops, tools and the event loop are built once, by whoever asks first
        # the agent pool, running blocking loops' turns (its threads start with the first turn)
        self._pool = ThreadPoolExecutor(multi_turn.max_concurrent_turns, thread_name_prefix="agent-turn")
        self._events: asyncio.AbstractEventLoop | None = None  # the agent's event loop, on a thread of its own
        self._slots = asyncio.Semaphore(multi_turn.max_concurrent_turns)  # turns on it at once
        self.last_prefill = PrefillStats()
        self.last_segments: tuple[tuple[int, int, float], ...] = ()  # the engine's, after a single-turn call

    def __getattr__(self, name: str) -> Any:  # only for what this class does not define
        if name == "engine":
            raise AttributeError(name)
        return getattr(self.engine, name)

    def __setattr__(self, name: str, value: object) -> None:
        """Own state (``_OWN`` and private names) here; anything else (``eos_token_ids``, ``version``, ...) is set on
        the wrapped engine, so the wrapper never shadows what the engine reads."""
        if name in _OWN or name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.engine, name, value)

    # ---- which loop ------------------------------------------------------------------------------------------------
    def loop_for(self, prompt: Prompt) -> AgentLoop:
        name = prompt.agent_name or self.default_agent_loop
        loop = self._loops.get(name)
        if loop is None:
            with self._lock:
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
        out = self.engine.generate(prompts, params, seed=seed, on_samples=on_samples)  # both engines report rows
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
        """Every "interrupted" row of ``rows`` to the end of its conversation on the engine's streaming interface (the
        module docstring), in input order. A pause request stops it between steps: rows on the engine come back
        "interrupted" mid-turn, those whose tools run when their calls return, at the start of their next turn."""
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
                        turns[self.start_turn(s, params)] = where[id(s.prompt), s.row]
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

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """The agent's event loop, running on a daemon thread of its own from the first turn on."""
        with self._lock:
            if self._events is None:
                self._events = asyncio.new_event_loop()
                threading.Thread(target=self._events.run_forever, name="agent-events", daemon=True).start()
            return self._events

    # ---- streaming (``asyncrl.rollout.streaming``; fully_async's Rollouter) ------------------------------------------
    # ``step``, ``interrupt``, ``drain`` and ``live_rows`` are the engine's: ``step`` returns the rows whose turn
    # ended; what follows a turn is ``start_turn``'s, off the decode (a row waiting for its tool holds no slot).
    def submit(self, rows: list[Sample], params: SamplingParams, seed: int | None = None) -> None:
        """As the engine's: the rows (blank, partial, or at the start of a turn after a tool's output) enter at its
        next step."""
        for s in rows:
            self.loop_for(s.prompt)  # an unknown agent_name fails here, not mid-stream
        self.engine.submit(rows, params, seed)

    def multi_turn_row(self, sample: Sample) -> bool:
        """Whether a row that ended goes through ``next_turn`` (its loop may go on, or its text is a conversation's)."""
        return not isinstance(self.loop_for(sample.prompt), SingleTurnAgent)

    def start_turn(self, sample: Sample, params: SamplingParams) -> Future[Sample]:
        """``next_turn`` of a row whose turn ended, started off the caller's thread: a loop's coroutine
        (``next_turn_async``) on the agent's event loop, a blocking loop's ``next_turns`` on the agent pool; at most
        ``rollout.multi_turn.max_concurrent_turns`` of either at once. The future holds the row (or the error)."""
        if self.loop_for(sample.prompt).awaits():
            return asyncio.run_coroutine_threadsafe(self._next_turn_async(sample, params), self._event_loop())
        return self._pool.submit(self.next_turn, sample, params)

    def next_turn(self, sample: Sample, params: SamplingParams) -> Sample:
        """What follows one row's ended turn (blocking: the tool calls run here, each under its deadline): the row
        "interrupted" with the tool's output appended, to decode its next turn, or the row ended with its
        conversation's text. Thread-safe. The row's loop is asked about this row alone (``next_turns([sample],
        [text])``)."""
        s, text = self._ended_turn(sample)
        c = self.loop_for(s.prompt).next_turns([s], [text])[0] if text is not None else None
        return self._after_turn(s, c, params)

    async def _next_turn_async(self, sample: Sample, params: SamplingParams) -> Sample:
        async with self._slots:
            s, text = self._ended_turn(sample)
            c = await self.loop_for(s.prompt).next_turn_async(s, text) if text is not None else None
            return self._after_turn(s, c, params)

    def _ended_turn(self, sample: Sample) -> tuple[Sample, str | None]:
        """The row as a multi-turn sample (its mask), and the text of the turn that ended when its loop is to be asked
        (eos, fewer than ``max_assistant_turns`` turns); None: the conversation ends."""
        s, loop = sample, self.loop_for(sample.prompt)
        if s.stop_reason != "eos":
            return s, None
        if s.response_mask is None and not isinstance(loop, SingleTurnAgent):
            s = dataclasses.replace(s, response_mask=[1] * len(s.response_ids))
        limit = self.multi_turn.max_assistant_turns
        return s, (self._last_turn_text(s) if limit is None or s.turns < limit else None)

    def _after_turn(self, s: Sample, c: Continuation | None, params: SamplingParams) -> Sample:
        """The row with the loop's continuation appended (its next turn to decode), or ended with its conversation's
        text (no continuation, or no room for another turn)."""
        if c is not None:
            s = dataclasses.replace(
                s, tool_calls=s.tool_calls + c.tool_calls, tool_errors=s.tool_errors + c.tool_errors
            )
            n = len(c.tokens)
            if len(s.response_ids) + n < params.max_new_tokens:
                return dataclasses.replace(
                    s,
                    response_ids=s.response_ids + c.tokens,
                    logprobs=s.logprobs + [0.0] * n,
                    versions=s.versions + [self.engine.version] * n,
                    response_mask=s.loss_mask + [0] * n,
                    stop_reason="interrupted",
                    turns=s.turns + 1,
                    reward=0.0,
                    reward_failed=False,
                    reward_extra={},
                )
            s = dataclasses.replace(s, stop_reason="length")  # no room for another turn
        if s.response_mask is not None:
            s.response_text = conversation_text(self.engine.tokenizer, s)
        return s

    def _last_turn_text(self, s: Sample) -> str:
        """The text of the model's last turn: the trailing run of its own tokens (mask 1; no mask: one turn, all)."""
        start, mask = 0, s.response_mask
        if mask is not None:
            start = len(mask)
            while start > 0 and mask[start - 1] == 1:
                start -= 1
        return self.engine.tokenizer.decode(s.response_ids[start:], skip_special_tokens=False)
