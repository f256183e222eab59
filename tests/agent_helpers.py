"""A micro model that has learned to call the ``calc`` tool, made here in seconds, for the agent-loop tests.

It is fitted (plain next-token cross-entropy) to a handful of conversations of the shape

    <|user|>E =<|end|><|assistant|><tool_call>{"name": "calc", ...E...}</tool_call><|end|>
    <|tool|>A<|end|><|assistant|>A<|end|>      (one line)

so that it calls the tool, reads the answer and repeats it; greedy decoding then follows that path.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from asyncrl.agent.format import TurnEncoder
from asyncrl.agent.tools import evaluate_arithmetic
from asyncrl.data.rows import write_rows
from asyncrl.models.loading import load_model
from asyncrl.models.presets import init_model_dir
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.schedules.sft import _sft_loss

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


def write_tool_data(root: Path, agent_name: str | None = None) -> Path:
    path = root / f"tool_rows_{agent_name or 'default'}.jsonl"
    write_rows(path, rows(agent_name))
    return path
