"""Token-in, token-out multi-turn text: tool calls parsed out of a model turn, tool outputs turned into tokens
(rendered by the tokenizer's own chat template and appended after the model's eos; docs/agent_loop.md, "Token in,
token out")."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from asyncrl.rollout.agent.tools import ToolCall, parse_arguments

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from asyncrl.types import Sample

TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_hermes_tool_calls(text: str) -> list[ToolCall]:
    """The ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks in ``text`` (verl's ``hermes`` format).
    A block that is not such JSON, or an unclosed tag, becomes a call with ``error`` set: the model is told."""
    calls: list[ToolCall] = []
    for body in TOOL_CALL_RE.findall(text):
        try:
            obj = json.loads(body)
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                raise ValueError('expected {"name": ..., "arguments": {...}}')
            calls.append(ToolCall(obj["name"], parse_arguments(obj.get("arguments", {}))))
        except (ValueError, TypeError) as e:
            calls.append(ToolCall("", {}, f"could not parse the tool call {body.strip()[:200]!r}: {e}"))
    if text.count("<tool_call>") > text.count("</tool_call>"):
        calls.append(ToolCall("", {}, "a <tool_call> tag was not closed"))
    return calls


def truncate(text: str, limit: int, side: str) -> str:
    """``text`` cut to ``limit`` characters as verl does: ``left`` keeps the start, ``right`` the end, ``middle``
    both ends; the cut is marked. ``limit`` <= 0: no limit."""
    if limit <= 0 or len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-limit:]
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[len(text) - (limit - half) :]


class TurnEncoder:
    """The tokens that follow the model's eos to hand it tool results and start its next turn: what the chat template
    renders after a reference conversation's assistant end-of-turn token once tool messages and the generation
    prompt follow."""

    _BASE = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tool agent needs a tokenizer with a chat_template (it renders the tool messages)")
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token
        if not eos:
            raise ValueError("the tool agent needs a tokenizer with an eos_token (the end of an assistant turn)")
        before = self._render(self._BASE, add_generation_prompt=False)
        if eos not in before:
            raise ValueError(f"the chat template does not end an assistant turn with the eos token {eos!r}")
        self._cut = before.rindex(eos) + len(eos)
        self._head = before[: self._cut]

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)

    def text(self, results: list[str]) -> str:
        """What follows the eos: the tool messages (one per result) and the next generation prompt, as text."""
        full = self._render(self._BASE + [{"role": "tool", "content": r} for r in results], add_generation_prompt=True)
        if not full.startswith(self._head):
            raise ValueError(
                "the chat template renders the earlier turns differently once a tool message follows; "
                "token-in/token-out appending cannot use it"
            )
        return full[self._cut :]

    def encode(self, results: list[str]) -> list[int]:
        return list(self.tokenizer(self.text(results), add_special_tokens=False)["input_ids"])


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
