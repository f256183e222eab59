"""VllmEngine's streaming side (``asyncrl.rollout.streaming``): one persistent vLLM step loop driven by ``step()``.

It drives the synchronous in-process ``LLMEngine`` that ``generate``/``resume`` drive, not vLLM's async engine, so the
caller decides when a step runs. Outputs are ``DELTA``, accumulated per row, so ``interrupt`` has every partial response
without asking vLLM and a streamed row is read by the same code (``_read_step``) as a batched one. A row is seeded as
``resume`` seeds it (``request_seed`` of its own noise). Why, and what was measured: docs/vllm.md, "How it works".

Threads: ``submit`` and ``live_rows`` from any thread (a lock guards the inbox); ``step``, ``interrupt`` and ``drain``
from the one thread that decodes. The engine's gate counts the held rows (``EngineGate.hold``/``release``): while any
is held ``update_weights``, ``generate`` and ``resume`` refuse, and ``submit`` refuses during them, so a step never
meets a weight update.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from asyncrl.rollout.gate import EngineGate
from asyncrl.rollout.sampling import continuation, extend_sample, resumable
from asyncrl.rollout.vllm_options import VllmOptions
from asyncrl.types import PrefillStats, Sample, SamplingParams

FINISH = {"stop": "eos", "length": "length", "abort": "interrupted"}  # vLLM's finish reason -> the row's stop reason


class VllmOutputError(RuntimeError):
    """vLLM returned an output that cannot be read as tokens with one log-prob each."""


@dataclass
class VllmRow:
    """A row as one vLLM request (a batched call's or the stream's): its order of submission, the row itself, what it
    decodes from (``continuation``), and what it has made so far."""

    seq: int
    sample: Sample
    params: SamplingParams
    prefix: list[int]
    budget: int
    key: int
    offset: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    started: bool = False  # vLLM has reported on it (its prefill is counted)


def vllm_rows(rows: list[Sample], params: SamplingParams, seed: int | None, seqs: list[int]) -> list[VllmRow]:
    """``rows`` as requests to continue (``continuation``), numbered ``seqs``."""
    prefixes, budgets, streams = continuation(rows, params, seed)
    return [
        VllmRow(q, s, params, prefix, budget, key, offset)
        for q, s, prefix, budget, key, offset in zip(seqs, rows, prefixes, budgets, streams.keys, streams.offsets)
    ]


class VllmStreaming:
    """The streaming contract over a vLLM engine (mixed into ``VllmEngine``, which provides the hooks below)."""

    tokenizer: PreTrainedTokenizerBase
    options: VllmOptions
    _gate: EngineGate
    _version: int

    # hooks, VllmEngine's: a request for one row, one engine step, aborting requests, and copying a colocated
    # trainer's weights in when stale
    _add_request: Callable[[str, VllmRow], None]
    _engine_step: Callable[[], list[Any]]
    _abort_requests: Callable[[list[str]], None]
    _sync_from_source: Callable[[], None]

    # ---- state ------------------------------------------------------------------------------------------------------
    def _init_stream(self) -> None:
        self._stream_lock = threading.Lock()
        self._inbox: list[VllmRow] = []  # submitted, not yet taken by a step (any thread appends)
        self._ready: list[Sample] = []  # submitted rows that need no decoding, reported at the next step
        self._waiting: deque[VllmRow] = deque()  # taken from the inbox, waiting for a slot (decode thread only)
        self._live: dict[str, VllmRow] = {}  # request id -> row decoding in vLLM (decode thread only)
        self._submitted = 0
        self._requests = 0
        self._stream_prefill = PrefillStats()

    @property
    def capacity(self) -> int:
        """Rows decoded at once: vLLM's ``max_num_seqs``."""
        return int(self.options.max_num_seqs)

    def take_prefill(self) -> PrefillStats:
        """Prefix tokens of streamed rows prefilled since the last call, and what prefilling each would have run
        (vLLM's prefix cache lets a group's rows share their prompt's)."""
        with self._stream_lock:
            out, self._stream_prefill = self._stream_prefill, PrefillStats()
        return out

    # ---- submit -----------------------------------------------------------------------------------------------------
    def submit(self, rows: list[Sample], params: SamplingParams, seed: int | None = None) -> None:
        """The streaming contract's ``submit``. Raises ValueError when ``params``/``seed`` differ from those of the
        rows already held, or a row's prefix leaves no room in ``max_model_len``; EngineBusyError during
        ``update_weights`` or a generate/resume."""
        if not rows:
            return
        ready, todo = resumable(rows, params, self.tokenizer)
        new = vllm_rows([rows[i] for i in todo], params, seed, todo)
        max_len = int(self.options.max_model_len)
        for row in new:  # vLLM would refuse them at the step, on the decoding thread
            if not row.sample.prompt.prompt_ids or len(row.prefix) >= max_len:
                raise ValueError(
                    f"VllmEngine.submit: row {row.sample.row} of prompt index {row.sample.prompt.index} has a prefix "
                    f"of {len(row.prefix)} tokens; it needs 1 to {max_len - 1} (rollout.max_model_len {max_len})"
                )
        if not self._gate.held:
            self._sync_from_source()  # colocated and stale: copy the trainer's weights in while nothing is held
        with self._stream_lock:
            self._gate.hold(len(rows), params, seed)
            base, self._submitted = self._submitted, self._submitted + len(rows)
            todo_set = set(todo)
            self._ready += [s for i, s in enumerate(ready) if i not in todo_set]
            for row in new:
                row.seq += base  # submission order across calls
            self._inbox += new

    # ---- step / drain / interrupt -----------------------------------------------------------------------------------
    def step(self) -> list[Sample]:
        if not self._gate.held:
            return []
        return self._advance(take_inbox=True)

    def drain(self) -> list[Sample]:
        if not self._gate.held:
            return []
        out = self._advance(take_inbox=True)
        while self._waiting or self._live:
            out += self._advance(take_inbox=False)
        return out

    def interrupt(self) -> list[Sample]:
        """Abort every live request; every held row, decoding and waiting ones in submission order, then the ones that
        needed no decoding. The engine then holds no row (unless another thread submits meanwhile)."""
        with self._stream_lock:
            pending, self._inbox = self._inbox, []
            ready, self._ready = self._ready, []
        if self._live:
            self._abort_requests(list(self._live))
        cut = [(r.seq, self._finish(r, "interrupted")) for r in self._live.values()]
        waiting = [(r.seq, r.sample) for r in [*self._waiting, *pending]]
        self._live.clear()
        self._waiting.clear()
        out = [s for _, s in sorted(cut + waiting, key=lambda pair: pair[0])] + ready
        self._gate.release(len(out))
        return out

    def _advance(self, take_inbox: bool) -> list[Sample]:
        """One step; called only while rows are held, so no weight update or batched call can run beside it."""
        with self._stream_lock:
            ready, self._ready = self._ready, []
            if take_inbox:
                self._waiting.extend(self._inbox)
                self._inbox = []
        try:
            out = ready + self._decode_step()
        except BaseException:
            with self._stream_lock:
                self._ready = ready + self._ready  # still held: a later step or interrupt reports them
            raise
        self._gate.release(len(out))
        return out

    def _decode_step(self) -> list[Sample]:
        # OpenMP's thread count is per calling thread (see VllmEngine._continue): set it on the thread that decodes
        torch.set_num_threads(torch.get_num_threads())
        while self._waiting and len(self._live) < self.capacity:
            row = self._waiting.popleft()
            self._requests += 1
            self._add_request(f"s{self._requests}", row)
            self._live[f"s{self._requests}"] = row
        if not self._live:
            return []
        ended, prefill = self._read_step(self._live)
        with self._stream_lock:
            self._stream_prefill += prefill
        return [sample for _, sample in ended]

    def _read_step(self, live: dict[str, VllmRow]) -> tuple[list[tuple[VllmRow, Sample]], PrefillStats]:
        """One engine step read into the rows of ``live`` (by request id; DELTA outputs: each token comes once):
        the rows that ended in it (taken off ``live``) with their continued samples, and the prefill counts of the
        requests vLLM reported on for the first time."""
        version = self._version  # no update can run during a step: every token of it is this version's
        ended: list[tuple[VllmRow, Sample]] = []
        prefill = PrefillStats()
        for output in self._engine_step():
            row = live.get(output.request_id)
            if row is None:
                continue
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            row.logprobs += sampled_logprobs(completion, tokens, output.request_id)
            row.tokens += tokens
            row.versions += [version] * len(tokens)
            if not row.started and output.num_cached_tokens is not None:
                n_prompt = len(output.prompt_token_ids or [])
                prefill += PrefillStats(n_prompt - int(output.num_cached_tokens), n_prompt, 1)
            row.started = True
            if output.finished:
                del live[output.request_id]
                ended.append((row, self._finish(row, FINISH.get(completion.finish_reason or "", "length"))))
        return ended, prefill

    def _finish(self, row: VllmRow, reason: str) -> Sample:
        return extend_sample(row.sample, row.tokens, row.logprobs, row.versions, reason, self.tokenizer)


def sampled_logprobs(completion: Any, tokens: list[int], rid: str) -> list[float]:
    """The log-prob vLLM recorded for each sampled token (it always includes the sampled token's own)."""
    entries = completion.logprobs or []
    if len(entries) != len(tokens):
        raise VllmOutputError(f"vLLM returned {len(tokens)} tokens but {len(entries)} log-probs for request {rid}")
    return [float(entry[token].logprob) for entry, token in zip(entries, tokens)]
