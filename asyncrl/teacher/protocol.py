"""The teacher wire format, the server's and the client's: the subset of vLLM's OpenAI-compatible
``POST /v1/completions`` used for scoring, so a real ``vllm serve`` is a valid teacher.

``choices[i].prompt_logprobs`` (vLLM's extension of the OpenAI API) is a list aligned with the prompt tokens. Entry 0
is ``null`` (the first token has no prediction); entry ``t >= 1`` is the teacher's distribution that *predicted*
token ``t``, as a JSON object keyed by token id (a string, since JSON keys are strings)::

    {"<actual id>": {"logprob": -2.1, "rank": 3, "decoded_token": "x"},   # the prompt token itself, always first
     "<top-1 id>":  {"logprob": -0.4, "rank": 1, "decoded_token": "y"},   # then the top k by rank 1..k
     ...}

so an entry has k entries when the actual token is in the top k and k+1 otherwise. ``rank`` is 1-based over the
full vocabulary (the number of ids whose log-prob is >= this one's); log-probs are natural-log softmax over the full
vocabulary at temperature 1, with ``-inf`` sent as ``-9999.0`` (vLLM's clamp: JSON has no infinity).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict, TypeGuard

import torch
from torch import Tensor

from asyncrl.errors import UserInputError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

LOGPROB_FLOOR = -9999.0  # what vLLM sends instead of -inf


class TeacherError(UserInputError, RuntimeError):
    """Base class of every teacher-client error; the message names the teacher URL."""


class TeacherUnavailableError(TeacherError):
    """The teacher could not be reached or kept failing (connection errors, timeouts, 5xx) after all retries."""


class TeacherRequestError(TeacherError):
    """The teacher rejected a request (HTTP 4xx, in ``status``): retrying the same request cannot help."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class TeacherResponseError(TeacherError):
    """The teacher answered, but not in the expected format (missing fields, wrong lengths, NaN)."""


class TokenizerMismatchError(TeacherError):
    """Teacher and student do not share a vocabulary, so the teacher's token ids would mean other tokens."""


class RequestError(ValueError):
    """A malformed request, reported to the caller as HTTP 400 naming the offending field (``param``)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def error_body(message: str, param: str | None, err_type: str = "invalid_request_error", code: int = 400) -> dict:
    """The JSON error object vLLM and OpenAI send: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


@dataclass(frozen=True)
class CompletionRequest:
    """One parsed ``/v1/completions`` request: token ids per prompt plus the scoring knobs (counts, not flags)."""

    prompts: list[list[int]]
    model: str | None
    max_tokens: int  # 0 = score only, 1 = also generate one token
    echo: bool
    prompt_logprobs: int | None  # top-k per prompt position; None = do not return prompt_logprobs
    logprobs: int | None  # top-k for generated (and, with echo, prompt) tokens in the OpenAI ``logprobs`` object
    temperature: float  # for the generated token only; 0 = greedy. Log-probs are always at temperature 1.
    seed: int | None


def _is_int(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def _optional_int(body: dict, name: str, hi: int | None = None) -> int | None:
    """A field that is absent/null or a non-negative integer (at most ``hi``)."""
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value) or value < 0:
        raise RequestError(name, f"{name} must be a non-negative integer (got {value!r})")
    if hi is not None and value > hi:
        raise RequestError(name, f"{name} must be at most {hi}, the vocabulary size (got {value})")
    return value


def _token_list(value: Sequence[object], where: str, vocab_size: int) -> list[int]:
    if not value:
        raise RequestError("prompt", f"{where} is empty (a prompt needs at least one token)")
    tokens: list[int] = []
    for i, tok in enumerate(value):
        if not _is_int(tok):
            raise RequestError("prompt", f"{where}[{i}] must be an integer token id (got {tok!r})")
        if not 0 <= tok < vocab_size:
            raise RequestError(
                "prompt", f"{where}[{i}]: token id {tok} is out of the vocabulary (ids 0..{vocab_size - 1})"
            )
        tokens.append(tok)
    return tokens


def parse_prompts(value: object, vocab_size: int, tokenize: Callable[[str], list[int]]) -> list[list[int]]:
    """``prompt`` as vLLM accepts it: token ids, a list of token-id lists, a string, or a list of strings."""
    if value is None:
        raise RequestError("prompt", "prompt is required (token ids, a list of token-id lists, or text)")
    if isinstance(value, str):
        return [_token_list(tokenize(value), "prompt (tokenized)", vocab_size)]
    if not isinstance(value, list) or not value:
        raise RequestError("prompt", f"prompt must be a non-empty list of token ids or a string (got {value!r:.80})")
    if all(isinstance(p, str) for p in value):
        return [_token_list(tokenize(p), f"prompt[{i}] (tokenized)", vocab_size) for i, p in enumerate(value)]
    if all(isinstance(p, list) for p in value):
        return [_token_list(p, f"prompt[{i}]", vocab_size) for i, p in enumerate(value)]
    return [_token_list(value, "prompt", vocab_size)]


def parse_completion_request(
    body: object, vocab_size: int, max_model_len: int, tokenize: Callable[[str], list[int]]
) -> CompletionRequest:
    """Validate a decoded JSON body; raises :class:`RequestError` naming the first bad field."""
    if not isinstance(body, dict):
        raise RequestError("body", f"request body must be a JSON object (got {type(body).__name__})")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("model", f"model must be a string (got {model!r})")
    if body.get("stream"):
        raise RequestError("stream", "stream=true is not supported by this teacher server")
    if body.get("n", 1) != 1:
        raise RequestError("n", f"n must be 1 (got {body.get('n')!r})")
    max_tokens = body.get("max_tokens", 0)
    if not _is_int(max_tokens) or max_tokens not in (0, 1):
        raise RequestError("max_tokens", f"max_tokens must be 0 or 1 (this server only scores; got {max_tokens!r})")
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise RequestError("echo", f"echo must be a boolean (got {echo!r})")
    prompt_logprobs = _optional_int(body, "prompt_logprobs", vocab_size)
    logprobs = _optional_int(body, "logprobs", vocab_size)
    seed = _optional_int(body, "seed")
    temperature = body.get("temperature")
    temperature = 1.0 if temperature is None else temperature
    if not isinstance(temperature, int | float) or isinstance(temperature, bool) or not 0 <= temperature < math.inf:
        raise RequestError("temperature", f"temperature must be a number >= 0 (got {temperature!r})")
    prompts = parse_prompts(body.get("prompt"), vocab_size, tokenize)
    for i, p in enumerate(prompts):
        if len(p) + max_tokens > max_model_len:
            raise RequestError(
                "prompt",
                f"prompt[{i}] is too long: this model's maximum context length is {max_model_len} tokens, but "
                f"{len(p)} prompt tokens + {max_tokens} max_tokens were requested",
            )
    # vLLM: with echo and no prompt_logprobs, the prompt is scored with ``logprobs`` entries per position.
    if prompt_logprobs is None and echo:
        prompt_logprobs = logprobs
    return CompletionRequest(prompts, model, max_tokens, echo, prompt_logprobs, logprobs, float(temperature), seed)


class LogprobEntry(TypedDict):
    """One token of a position's ``prompt_logprobs`` / ``logprobs`` entry, as vLLM writes it."""

    logprob: float  # nats, floored at LOGPROB_FLOOR
    rank: int  # 1-based over the vocabulary
    decoded_token: str


# What the teacher computed at one position, as Python values: (the token's id, its log-prob, its 1-based rank over
# the vocabulary, the top k ids most likely first, their log-probs).
Scored = tuple[int, float, int, list[int], list[float]]


def logprob_entry(scored: Scored, decode: Callable[[int], str]) -> dict[str, LogprobEntry]:
    """One position's ``{id: {logprob, rank, decoded_token}}``: the actual token first, then the top k by rank.

    As in vLLM, an actual token that is also in the top k keeps its first place in the key order but takes its
    top-k rank (the second insertion overwrites the value).
    """
    actual_id, actual_logp, actual_rank, top_ids, top_logp = scored
    ranked = [(actual_id, actual_logp, actual_rank), *zip(top_ids, top_logp, range(1, len(top_ids) + 1))]
    return {
        str(tid): {"logprob": max(lp, LOGPROB_FLOOR), "rank": rank, "decoded_token": decode(tid)}
        for tid, lp, rank in ranked
    }


def openai_logprobs(
    token_ids: list[int], entries: list[dict[str, LogprobEntry] | None], k: int, decode: Callable[[int], str]
) -> dict[str, list]:
    """The OpenAI completions ``logprobs`` object (tokens, token_logprobs, top_logprobs, text_offset) from entries.

    ``top_logprobs`` is keyed by decoded text and holds at most k+1 entries (the actual token and the top k), as in
    OpenAI's API; a ``None`` entry (the first prompt token) gives a null log-prob. ``decode`` is the one that wrote
    the entries' ``decoded_token``.
    """
    tokens = [decode(tid) for tid in token_ids]
    return {
        "text_offset": list(itertools.accumulate((len(t) for t in tokens), initial=0))[:-1],
        "token_logprobs": [
            None if e is None else e[str(tid)]["logprob"] for tid, e in zip(token_ids, entries, strict=True)
        ],
        "tokens": tokens,
        "top_logprobs": [
            None if e is None else {x["decoded_token"]: x["logprob"] for x in list(e.values())[: k + 1]}
            for e in entries
        ],
    }


@dataclass
class SequenceScores:
    """What the teacher computed for one prompt."""

    prompt: list[Scored] | None  # row ``t`` is about token ``t + 1``; None when prompt_logprobs was not asked
    gen: Scored | None  # the generated token (max_tokens=1)


def completion_response(
    req: CompletionRequest,
    scores: list[SequenceScores],
    model: str,
    tokenizer: PreTrainedTokenizerBase,
    eos_ids: set[int],
    decode_one: Callable[[int], str],
) -> dict[str, object]:
    """The whole ``/v1/completions`` reply: id, created, usage and one choice per prompt, in order, in vLLM's shape
    (text, OpenAI ``logprobs``, finish reason and ``prompt_logprobs``)."""
    choices: list[dict[str, object]] = []
    for index, (tokens, s) in enumerate(zip(req.prompts, scores)):
        prompt_entries: list[dict[str, LogprobEntry] | None] | None = None
        if s.prompt is not None:
            prompt_entries = [None] + [logprob_entry(row, decode_one) for row in s.prompt]
        gen_ids = [s.gen[0]] if s.gen else []
        gen_entries: list[dict[str, LogprobEntry] | None] = [logprob_entry(s.gen, decode_one)] if s.gen else []
        # vLLM: echo prepends the prompt to the text and, with ``logprobs``, to the logprobs object
        text = (decode_text(tokenizer, tokens) if req.echo else "") + decode_text(tokenizer, gen_ids)
        ids, entries = (tokens + gen_ids, (prompt_entries or []) + gen_entries) if req.echo else (gen_ids, gen_entries)
        logprobs = None if req.logprobs is None else openai_logprobs(ids, entries, req.logprobs, decode_one)
        choices.append(
            {
                "index": index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": "stop" if gen_ids and gen_ids[0] in eos_ids else "length",
                "stop_reason": None,
                "prompt_logprobs": prompt_entries,
            }
        )
    n_prompt = sum(len(p) for p in req.prompts)
    n_gen = req.max_tokens * len(req.prompts)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": n_prompt, "total_tokens": n_prompt + n_gen, "completion_tokens": n_gen},
    }


def decode_text(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    """One sequence's text (a flat id list decodes to one string; transformers types ``decode`` as either)."""
    text = tokenizer.decode(ids)
    return text if isinstance(text, str) else "".join(text)


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """``sha256:<hex>`` of the tokenizer's full ``(token, id)`` table, sorted by id: equal iff ids mean the same."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    blob = json.dumps(vocab, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return "sha256:" + hashlib.sha256(blob).hexdigest()


@dataclass
class TopK:
    """The teacher's view of one sequence of T tokens, for every position after the first.

    Row ``t`` (0-based, ``T - 1`` rows) is the teacher's distribution that predicts token ``t + 1``:
    ``ids_TK`` (long) holds its K most likely ids, most likely first, ``logp_TK`` (float32, nats) their log-probs
    over the full vocabulary (so ``logp_TK.exp().sum(-1) <= 1``), and ``token_logp_T`` (float32) the log-prob of the
    token that actually came next. Stack rows of a batch to get ``teacher_topk_ids_BTK`` / ``teacher_topk_logp_BTK``.
    """

    ids_TK: Tensor
    logp_TK: Tensor
    token_logp_T: Tensor


def _number(x: object, where: str) -> float:
    if not isinstance(x, int | float) or isinstance(x, bool) or math.isnan(x):
        raise TeacherResponseError(f"{where}: logprob must be a number (got {x!r})")
    return float(x)


def topk_from_prompt_logprobs(prompt_logprobs: object, token_ids: list[int], k: int, where: str) -> TopK:
    """Turn one choice's ``prompt_logprobs`` into a :class:`TopK` of ``k`` ids per position.

    Entries are ordered by log-prob (ties: lower rank first), so an actual token outside the top k that ties with
    the k-th is dropped, not the k-th. Raises :class:`TeacherResponseError` naming ``where`` and the position.
    """
    n = len(token_ids)
    if not isinstance(prompt_logprobs, list) or len(prompt_logprobs) != n:
        got = len(prompt_logprobs) if isinstance(prompt_logprobs, list) else type(prompt_logprobs).__name__
        raise TeacherResponseError(f"{where}: prompt_logprobs must be a list of {n} entries (got {got})")
    ids, logps, token_logp = [], [], []
    for t in range(1, n):
        entry = prompt_logprobs[t]
        at = f"{where}: prompt_logprobs[{t}]"
        if not isinstance(entry, dict):
            raise TeacherResponseError(f"{at} must be an object keyed by token id (got {type(entry).__name__})")
        actual = entry.get(str(token_ids[t]))
        if not isinstance(actual, dict):
            raise TeacherResponseError(f"{at} lacks the actual token id {token_ids[t]}")
        token_logp.append(_number(actual.get("logprob"), at))
        items = []
        for key, value in entry.items():
            if not isinstance(value, dict):
                raise TeacherResponseError(f"{at}[{key!r}] must be an object with a logprob")
            if not key.isdigit():
                raise TeacherResponseError(f"{at}: key {key!r} is not a token id")
            rank = value.get("rank")
            items.append((-_number(value.get("logprob"), at), rank if _is_int(rank) else 0, int(key)))
        if len(items) < k:
            raise TeacherResponseError(f"{at} has {len(items)} entries, fewer than top_k={k}")
        items.sort()
        ids.append([tid for _, _, tid in items[:k]])
        logps.append([-neg for neg, _, _ in items[:k]])
    return TopK(
        ids_TK=torch.tensor(ids, dtype=torch.long).reshape(n - 1, k),
        logp_TK=torch.tensor(logps, dtype=torch.float32).reshape(n - 1, k),
        token_logp_T=torch.tensor(token_logp, dtype=torch.float32),
    )
