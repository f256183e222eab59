"""Row-level helpers both engines share: the prompt check, each row's noise, ``resume``'s triage and continued samples.

Kept apart from ``engine`` so the streaming decoder's engine glue and the vLLM engine use one definition of what
"continuing a row" means (same noise keys, same triage, same continued ``Sample``).
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from asyncrl.rollout.sampling import RowStreams, SamplingParams
from asyncrl.types import Prompt, Sample


def check_prompts(prompts: list[Prompt], owner: str) -> None:
    """A prompt without tokens is an error naming its index (both engines' ``generate``)."""
    for prompt in prompts:
        if not prompt.prompt_ids:
            raise ValueError(f"{owner}.generate: prompt index {prompt.index} has no tokens")


def row_streams(samples: list[Sample], seed: int | None) -> RowStreams:
    """Each sample's own noise, continuing where its response stopped (both engines' ``resume``)."""
    rows = [(s.prompt.epoch, s.prompt.index, s.row) for s in samples]
    return RowStreams.of(seed, rows, [len(s.response_ids) for s in samples])


def resumable(
    samples: list[Sample], params: SamplingParams, tokenizer: PreTrainedTokenizerBase
) -> tuple[list[Sample], list[int]]:
    """``resume``'s triage, for both engines: (the output list with every sample that needs no decoding in its final
    form, the indices still to decode). Samples that are not "interrupted" stay as they are; an interrupted one
    already at ``max_new_tokens`` becomes "length"."""
    out = list(samples)
    todo: list[int] = []
    for i, s in enumerate(samples):
        if s.stop_reason != "interrupted":
            continue
        if len(s.response_ids) >= params.max_new_tokens:
            out[i] = extend_sample(s, [], [], [], "length", tokenizer)
        else:
            todo.append(i)
    return out, todo


def extend_sample(
    sample: Sample,
    tokens: list[int],
    logprobs: list[float],
    versions: list[int],
    stop_reason: str,
    tokenizer: PreTrainedTokenizerBase,
) -> Sample:
    """A copy of ``sample`` with a continuation the model generated appended (reward fields reset: the response
    changed; a multi-turn sample's mask and counters carried on); both engines build their continued samples with
    it."""
    response_ids = sample.response_ids + tokens
    return Sample(
        prompt=sample.prompt,
        response_ids=response_ids,
        logprobs=sample.logprobs + logprobs,
        versions=sample.versions + versions,
        stop_reason=stop_reason,
        start_version=sample.start_version,
        response_text=tokenizer.decode(response_ids, skip_special_tokens=True),
        response_mask=None if sample.response_mask is None else sample.response_mask + [1] * len(tokens),
        turns=sample.turns,
        tool_calls=sample.tool_calls,
        tool_errors=sample.tool_errors,
        row=sample.row,
    )
