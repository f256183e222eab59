"""Where an agent loop's turns run: a loop's coroutine (``next_turn_async``, as ``tool_agent``'s) on the agent's event
loop, every row's turn beside the others on that one thread; a blocking loop (``next_turns``) on the agent pool; at
most ``rollout.multi_turn.max_concurrent_turns`` of either at once. The scripted engine of test_agent_loop decodes a
real micro model's rows with a scripted policy (its first turn calls ``calc``)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from asyncrl.config.errors import ConfigError
from asyncrl.rollout.agent.loop import AgentLoop, Continuation, check_agent_loop
from tests.agent_helpers import make_tool_model
from tests.test_agent_loop import GREEDY, prompts_of, scripted_engine

MEET_S = 30.0  # how long a row's turn waits for the others: reached only when they never come (a failure)


@pytest.fixture(scope="module")
def untrained_model(tmp_path_factory):
    return make_tool_model(tmp_path_factory.mktemp("agent_events"), steps=0)


class MeetsTheOthers(AgentLoop):
    """Each row's first turn waits, awaiting, until every row of the call is in its first turn at once, then goes on
    with one more turn; records the threads its turns ran on."""

    rows = 0
    arrived: list[int] = []
    threads: set[str] = set()

    async def next_turn_async(self, sample, turn_text):
        cls = MeetsTheOthers
        cls.threads.add(threading.current_thread().name)
        if sample.turns > 1:
            return None
        cls.arrived.append(sample.row)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + MEET_S
        while len(cls.arrived) < cls.rows and loop.time() < deadline:
            await asyncio.sleep(0.001)
        return Continuation([self.ctx.tokenizer.eos_token_id], tool_calls=1) if len(cls.arrived) >= cls.rows else None


class Blocking(AgentLoop):
    """A loop written for batches (blocking ``next_turns``): one more turn after the first; records its threads."""

    threads: set[str] = set()

    def next_turns(self, samples, turn_texts):
        Blocking.threads.add(threading.current_thread().name)
        return [
            Continuation([self.ctx.tokenizer.eos_token_id], tool_calls=1) if s.turns == 1 else None for s in samples
        ]


class CountsAtOnce(AgentLoop):
    """A coroutine loop whose turn waits for a second turn to be inside with it (or 5 s), holds 20 ms more, and
    records how many turns were inside at once."""

    inside = 0
    most = 0

    async def next_turn_async(self, sample, turn_text):
        CountsAtOnce.inside += 1  # one thread: no lock needed
        CountsAtOnce.most = max(CountsAtOnce.most, CountsAtOnce.inside)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while CountsAtOnce.inside < 2 and loop.time() < deadline:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.02)
        CountsAtOnce.inside -= 1
        return None


class Neither(AgentLoop):
    pass


def test_coroutine_turns_of_every_row_run_at_once_on_the_agents_event_loop(untrained_model):
    engine, tok = scripted_engine(untrained_model, default="tests.test_agent_events:MeetsTheOthers")
    prompts = prompts_of(tok)
    MeetsTheOthers.rows, MeetsTheOthers.arrived[:], MeetsTheOthers.threads = len(prompts) * GREEDY.n, [], set()
    out = engine.generate(prompts, GREEDY, seed=0)
    # every row met all the others while their turns were awaiting, so each went on to a second turn
    assert [s.turns for s in out] == [2] * len(out) and all(s.stop_reason == "eos" for s in out)
    assert MeetsTheOthers.threads == {"agent-events"}  # one thread ran every row's turns


def test_a_blocking_loop_runs_on_the_agent_pool(untrained_model):
    engine, tok = scripted_engine(untrained_model, default="tests.test_agent_events:Blocking")
    Blocking.threads = set()
    out = engine.generate(prompts_of(tok), GREEDY, seed=0)
    assert [s.turns for s in out] == [2] * len(out)
    assert Blocking.threads and all(t.startswith("agent-turn") for t in Blocking.threads)


def test_at_most_max_concurrent_turns_coroutines_at_once(untrained_model):
    engine, tok = scripted_engine(
        untrained_model, default="tests.test_agent_events:CountsAtOnce", max_concurrent_turns=2
    )
    CountsAtOnce.inside = CountsAtOnce.most = 0
    out = engine.generate(prompts_of(tok), GREEDY, seed=0)
    assert len(out) > 2 and all(s.turns == 1 for s in out)
    assert CountsAtOnce.most == 2  # turns met two at a time, never more


def test_a_loop_defining_neither_method_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"Neither' defines neither next_turns nor next_turn_async"):
        check_agent_loop("tests.test_agent_events:Neither")
