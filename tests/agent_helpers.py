"""A micro model that has learned to call the ``calc`` tool, made here in seconds, for the agent-loop tests.

It is fitted (plain next-token cross-entropy) to a handful of conversations of the shape

    <|user|>E =<|end|><|assistant|><tool_call>{"name": "calc", ...E...}</tool_call><|end|>
    <|tool|>A<|end|><|assistant|>A<|end|>      (one line)

so that it calls the tool, reads the answer and repeats it; greedy decoding then follows that path.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import torch

from asyncrl.data.rows import write_rows
from asyncrl.finetune.sft import _sft_loss
from asyncrl.models.loading import load_model
from asyncrl.models.presets import init_model_dir
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.rollout.agent.format import TurnEncoder, parse_hermes_tool_calls
from asyncrl.rollout.agent.tools import CalcTool, call_each, evaluate_arithmetic
from asyncrl.rollout.continuous import StreamRow
from asyncrl.rollout.engine import DecodeResult, RolloutEngine
from asyncrl.types import PrefillStats

EXPRESSIONS = ["12 + 34", "56 + 7", "8 + 90", "41 + 25"]


def tool_call_text(expression: str) -> str:
    return "<tool_call>" + json.dumps({"name": "calc", "arguments": {"expression": expression}}) + "</tool_call>"


def rows(agent_name: str | None = None) -> list[dict]:
    out = []
    for i, e in enumerate(EXPRESSIONS):
        row = {
            "data_source": "chain_sum",
            "prompt": [{"role": "user", "content": f"{e} ="}],
            "reward_model": {"style": "rule", "ground_truth": evaluate_arithmetic(e)},
            "extra_info": {"index": i},
        }
        if agent_name is not None:
            row["agent_name"] = agent_name
        out.append(row)
    return out


def make_tool_model(root: Path, steps: int = 250, seed: int = 0, preset: str = "micro", lr: float = 1e-2) -> Path:
    """A ``preset`` model over a char tokenizer with the tool turn, fitted to call ``calc`` on ``EXPRESSIONS``."""
    texts = (
        [f"{e} =" for e in EXPRESSIONS]
        + [tool_call_text(e) for e in EXPRESSIONS]
        + ["0123456789+-= ", "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.,:'_()<>"]
    )
    out = root / f"tool_model_{preset}"
    init_model_dir(preset, build_char_tokenizer(texts), out, seed=seed)
    model, tok = load_model(out)
    encoder = TurnEncoder(tok)
    examples = []
    for e in EXPRESSIONS:
        prompt = tok.apply_chat_template([{"role": "user", "content": f"{e} ="}], add_generation_prompt=True)
        answer = evaluate_arithmetic(e)
        text = tool_call_text(e) + tok.eos_token + encoder.text([answer]) + answer + tok.eos_token
        examples.append((list(prompt["input_ids"]), tok(text, add_special_tokens=False)["input_ids"]))
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(steps):
        loss = _sft_loss(model, examples, tok.pad_token_id)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def check_tool_turns(tok, samples) -> list[list[str | None]]:
    """What holds for any conversation, whatever calls the model made: the response mask, log-probs and versions
    line up; tool tokens carry log-prob 0; the tool turn is the tool's output for the call the model wrote (run
    again here). Returns each sample's called expressions."""
    made = []
    for s in samples:
        mask = s.loss_mask  # all ones for a first turn that never ended (no eos: the loop never ran)
        assert len(mask) == len(s.response_ids) == len(s.logprobs) == len(s.versions)
        assert all(lp == 0.0 for lp, m in zip(s.logprobs, mask) if m == 0)
        first = mask.index(0) if 0 in mask else len(mask)
        calls = parse_hermes_tool_calls(tok.decode(s.response_ids[:first], skip_special_tokens=False))
        if 0 in mask:
            results = asyncio.run(call_each({"calc": CalcTool()}, calls, timeout_s=5))
            tool_ids = [t for t, m in zip(s.response_ids, mask) if m == 0]
            assert tool_ids == TurnEncoder(tok).encode([r.text for r in results])
            assert s.tool_calls == len(calls) and s.turns == 2
        else:  # no tool turn: no call was answered
            assert s.tool_calls == 0 or s.stop_reason == "length"
        made.append([c.arguments.get("expression") for c in calls])
    return made


def write_tool_data(root: Path, agent_name: str | None = None) -> Path:
    path = root / f"tool_rows_{agent_name or 'default'}.jsonl"
    write_rows(path, rows(agent_name))
    return path


class ScriptedEngine(RolloutEngine):
    """The built-in engine with its decoding scripted: every other part (generate/resume and submit/step
    bookkeeping, versions, the busy gate, weight updates) is the real ``RolloutEngine``'s, but each turn's tokens are
    what ``policy`` returns, whatever the model's weights would have chosen, so a test can assert exact tool calls on
    any CPU.

    ``policy(prompt_ids, response_ids)`` gives the text of the row's current assistant turn (eos is appended); a
    turn interrupted part-way continues where it stopped. A streamed row (``submit``/``step``) decodes its whole turn
    in one step. Every emitted token has log-prob ``LOGPROB``."""

    LOGPROB = -0.25

    def __init__(self, model, tok, policy, prompts):
        super().__init__(model, tok)
        self.policy = policy
        self.prompt_ids = [tuple(p.prompt_ids) for p in prompts]
        self._stream = ScriptedDecoder(self)

    def _turn(self, prefix: list[int]) -> list[int]:
        for ids in self.prompt_ids:
            if tuple(prefix[: len(ids)]) == ids:
                response = prefix[len(ids) :]
                turn = self.tokenizer.encode(self.policy(list(ids), response), add_special_tokens=False)
                turn.append(self.eos_token_ids[0])
                done = max(
                    (k for k in range(len(turn)) if k <= len(response) and response[len(response) - k :] == turn[:k]),
                    default=0,
                )
                return turn[done:]
        raise AssertionError(f"ScriptedEngine: no prompt starts {self.tokenizer.decode(prefix)!r}")

    def _scripted(self, prefix: list[int], budget: int) -> tuple[list[int], str]:
        turn = self._turn(prefix)
        return (turn[:budget], "length") if len(turn) > budget else (turn, "eos")

    def _decode_all(self, prefixes, budgets, params, seed, refill=None, on_ended=None):
        out = DecodeResult([], [], [])
        for i, (prefix, budget) in enumerate(zip(prefixes, budgets)):
            tokens, reason = self._scripted(prefix, budget)
            out.tokens.append(tokens)
            out.logprobs.append([self.LOGPROB] * len(tokens))
            out.stop_reasons.append(reason)
            if on_ended is not None:
                on_ended([(StreamRow(i, prefix, budget, 0, 0, tokens, out.logprobs[-1]), reason)])
        self.last_prefill = PrefillStats()
        return out


class ScriptedDecoder:
    """``ScriptedEngine``'s streaming decoder (the slot decoder's interface): every row held ends its turn at the
    next step."""

    def __init__(self, engine: ScriptedEngine):
        self.engine, self.rows = engine, []

    def check_supported(self) -> None:
        pass

    def submit(self, rows: list[StreamRow]) -> None:
        self.rows += rows

    def step(self, params, admit_below=None) -> list[tuple[StreamRow, str]]:
        now = [r for r in self.rows if admit_below is None or r.tag < admit_below]
        self.rows = [r for r in self.rows if admit_below is not None and r.tag >= admit_below]
        ended = []
        for row in now:
            tokens, reason = self.engine._scripted(row.prefix, row.budget)
            row.tokens, row.logprobs = tokens, [ScriptedEngine.LOGPROB] * len(tokens)
            ended.append((row, reason))
        return ended

    def interrupt(self) -> list[StreamRow]:
        out, self.rows = self.rows, []
        return out

    def take_prefill(self) -> PrefillStats:
        return PrefillStats()
