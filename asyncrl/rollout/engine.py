"""RolloutEngine: batched sampling from a transformers causal LM, pausable, with in-place weight updates.

Every call decodes on our own slot decoder (``asyncrl.rollout.continuous``), not ``model.generate``: RL needs per-token
behaviour log-probs and weight versions, pause/resume around weight syncs, and rows that enter and leave a running
decode (docs/design.md, "One decode path").

Threads: ``generate``/``resume`` run on one thread; ``request_pause`` (any thread) makes a running call return at the
next decode step with the unfinished rows "interrupted". ``update_weights`` refuses while a call is in flight (pause,
wait for the call to return, update, ``clear_pause``, ``resume``), so every token's version is the weights that
produced it. Streaming (``asyncrl.rollout.streaming``): ``submit`` from any thread, ``step``/``interrupt``/``drain`` on
the driver's; while rows are held, ``generate``/``resume``/``update_weights`` raise EngineBusyError, and
``request_pause`` plays no part (``interrupt`` returns the partial rows at once).
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from asyncrl.models.fp8 import sync_layout
from asyncrl.models.loading import eos_token_ids as default_eos_token_ids
from asyncrl.models.lora import is_lora, merged_update, synced_tensors
from asyncrl.rollout.bucket_update import Applying, Items, Named, checked_buckets, checked_whole, copy_into
from asyncrl.rollout.continuous import ContinuousDecoder, StreamRow
from asyncrl.rollout.gate import EngineGate, GatedEngine
from asyncrl.rollout.sampling import RowStreams, SamplingParams, continuation, extend_sample, resumable
from asyncrl.types import PrefillStats, Sample, engine_chunks

logger = logging.getLogger(__name__)


@dataclass
class DecodeResult:
    """A ``generate``/``resume`` call's rows, in input order: new tokens, their behaviour log-probs, and why each
    stopped ("eos", "length" or "interrupted")."""

    tokens: list[list[int]]
    logprobs: list[list[float]]
    stop_reasons: list[str]


class RolloutEngine(GatedEngine):
    """Generates ``Sample``s from ``Prompt``s with the weights of version ``version``.

    ``eos_token_ids`` default to the tokenizer's eos plus the generation config's. ``max_batch_size``: the decoder's
    slots (more rows wait for a free one). ``share_prefixes``: identical prefixes entering together (a prompt's n rows)
    are prefilled once, the samples unchanged; ``last_prefill``: the last call's prefill tokens, shared and unshared.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        eos_token_ids: list[int] | None = None,
        max_batch_size: int = 256,
        version: int = 0,
        share_prefixes: bool = True,
        quantization: str | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"RolloutEngine: max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = default_eos_token_ids(model, tokenizer) if eos_token_ids is None else eos_token_ids
        self.max_batch_size = max_batch_size
        self.version = version
        self.share_prefixes = share_prefixes
        self.quantization = quantization  # "fp8": syncs arrive quantized (asyncrl.models.fp8) and are dequantized
        self.last_prefill = PrefillStats()
        self.last_segments: tuple[tuple[int, int, float], ...] = ()  # the last decode's steps (``_decode_all``)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        self.pad_id: int = int(pad_id)
        # the forward can skip the lm_head for all but the last position (saves prefill time and memory)
        self._keep_last = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._gate = EngineGate("RolloutEngine")
        self._params = dict(model.named_parameters(remove_duplicate=False))  # tied aliases included
        self._max_positions: int | None = getattr(model.config, "max_position_embeddings", None)
        self._warned_positions = False
        # streaming (asyncrl.rollout.streaming): the slot decoder, and the submitted rows not yet reported, by tag
        self._stream = ContinuousDecoder(
            model, max_batch_size, self.eos_token_ids, self.pad_id, self._keep_last, share_prefixes
        )
        self._calls: ContinuousDecoder | None = None  # generate/resume's (``_decode_all``)
        self._stream_lock = threading.Lock()
        self._streamed: dict[int, Sample] = {}  # rows in the decoder, as submitted
        self._ready: list[tuple[int, Sample]] = []  # rows that need no decoding, reported at the next step
        self._next_tag = 0

    @property
    def eos_token_ids(self) -> list[int]:
        """The ids that end a row. An assignment reaches both decoders: a streamed row decoding now reads the new
        ids from its next token on."""
        return self._eos_token_ids

    @eos_token_ids.setter
    def eos_token_ids(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("RolloutEngine: no eos token ids (tokenizer and generation config define none)")
        self._eos_token_ids = list(ids)
        stream: ContinuousDecoder | None = getattr(self, "_stream", None)  # None while __init__ runs
        if stream is not None:
            stream.eos_ids = frozenset(ids)

    # -------------------------------------------------------------------------------------------------- generate

    def _continue(
        self,
        rows: list[Sample],
        params: SamplingParams,
        seed: int | None,
        refill: Callable[[int], bool] | None = None,
        on_samples: Callable[[list[Sample]], None] | None = None,
    ) -> list[Sample]:
        version = self.version
        prefixes, budgets, streams = continuation(rows, params, seed)
        made: dict[int, Sample] = {}

        def continued(i: int, tokens: list[int], logprobs: list[float], reason: str) -> Sample:
            return extend_sample(rows[i], tokens, logprobs, [version] * len(tokens), reason, self.tokenizer)

        def finished(ended: list[tuple[StreamRow, str]]) -> None:
            made.update((row.tag, continued(row.tag, row.tokens, row.logprobs, reason)) for row, reason in ended)
            on_samples([made[row.tag] for row, _ in ended])  # type: ignore[misc]

        result = self._decode_all(prefixes, budgets, params, streams, refill, finished if on_samples else None)
        return [
            made.get(i) or continued(i, tokens, logprobs, reason)
            for i, (tokens, logprobs, reason) in enumerate(zip(result.tokens, result.logprobs, result.stop_reasons))
        ]

    def _decode_all(
        self,
        prefixes: list[list[int]],
        budgets: list[int],
        params: SamplingParams,
        streams: RowStreams,
        refill: Callable[[int], bool] | None = None,
        on_ended: Callable[[list[tuple[StreamRow, str]]], None] | None = None,
    ) -> DecodeResult:
        """Decode all rows on a slot decoder of ``max_batch_size`` slots of their own, results in input order
        (``on_ended``: a step's ended rows, tagged by input position, with "eos" or "length", as the others decode on).

        The rows are submitted at once; with more than the slots, sorted by prefix length (``engine_chunks``, stable:
        a prompt's n rows stay adjacent and share one prefill) so rows entering together pad less, and a waiting row
        takes the first slot that frees. Between steps a pause request (``request_pause``) or ``refill(live rows)``
        returning True stops the call: the unfinished rows keep their tokens and come back "interrupted". Sets
        ``last_prefill`` and ``last_segments`` (slots in use, steps, seconds: each stretch of steps over a constant
        batch, admission's prefill left out; ``planning.cost.decode_segments`` reproduces them from the rows' lengths).
        """
        self._check_positions(prefixes, budgets)
        decoder = self._calls  # kept so its buffers grow when a call needs room, not every call
        now = (self.max_batch_size, frozenset(self.eos_token_ids), self.pad_id, self.share_prefixes)
        if decoder is None or (decoder.capacity, decoder.eos_ids, decoder.pad_id, decoder.share_prefixes) != now:
            decoder = self._calls = ContinuousDecoder(  # made anew when they change
                self.model, self.max_batch_size, self.eos_token_ids, self.pad_id, self._keep_last, self.share_prefixes
            )
        decoder.check_supported()
        order = [i for chunk in engine_chunks([len(p) for p in prefixes], self.max_batch_size) for i in chunk]
        keys, offsets = streams.keys, streams.offsets
        rows = [StreamRow(i, p, n, keys[i], offsets[i]) for i, (p, n) in enumerate(zip(prefixes, budgets))]
        reasons = ["interrupted"] * len(prefixes)
        segments: list[list] = []  # [rows, steps, seconds]
        if not self._gate.pause.is_set():
            decoder.submit([rows[i] for i in order])
            left = len(rows)
            while left:
                t0 = time.perf_counter()
                ended = decoder.step(params)
                seconds = time.perf_counter() - t0 - decoder.admit_s
                if segments and segments[-1][0] == decoder.step_rows:
                    segments[-1][1:] = segments[-1][1] + 1, segments[-1][2] + seconds
                else:
                    segments.append([decoder.step_rows, 1, seconds])
                for row, reason in ended:
                    reasons[row.tag], left = reason, left - 1
                if ended and on_ended is not None:
                    on_ended(ended)
                if left and (self._gate.pause.is_set() or (refill is not None and refill(left - decoder.waiting()))):
                    break
            if left:
                decoder.interrupt()  # the rows keep their tokens so far; the buffers go
        self.last_prefill = decoder.take_prefill()
        self.last_segments = tuple(map(tuple, segments))
        return DecodeResult([r.tokens for r in rows], [r.logprobs for r in rows], reasons)

    def _check_positions(self, prefixes: list[list[int]], budgets: list[int]) -> None:
        longest = max(len(p) + n for p, n in zip(prefixes, budgets)) if prefixes else 0
        if self._max_positions and longest > self._max_positions and not self._warned_positions:
            self._warned_positions = True
            logger.warning(
                "RolloutEngine: prompt + max_new_tokens reaches %d tokens, beyond the model's "
                "max_position_embeddings %d; quality past that length is untrained",
                longest,
                self._max_positions,
            )

    # ------------------------------------------------------------------------- streaming (asyncrl.rollout.streaming)

    @property
    def capacity(self) -> int:
        """Rows the streaming decoder decodes at once (a slot each): ``max_batch_size``."""
        return self.max_batch_size

    def submit(self, rows: list[Sample], params: SamplingParams, seed: int | None = None) -> None:
        """The streaming contract's ``submit`` (``asyncrl.rollout.streaming``). All rows held at once share one
        ``params`` and ``seed`` (ValueError naming both otherwise); EngineBusyError during a generate/resume or a
        weight update; NotImplementedError for a model with layers other than full attention and sliding window."""
        if not rows:
            return
        self._stream.check_supported()
        out, todo = resumable(rows, params, self.tokenizer)
        prefixes, budgets, streams = continuation([rows[i] for i in todo], params, seed)
        self._check_positions(prefixes, budgets)
        with self._stream_lock:
            self._gate.hold(len(rows), params, seed)
            tag = self._next_tag
            self._next_tag += len(rows)
            decode = set(todo)
            self._ready += [(tag + i, s) for i, s in enumerate(out) if i not in decode]
            self._streamed.update((tag + i, rows[i]) for i in todo)
            keys, offsets = streams.keys, streams.offsets
            new = [StreamRow(tag + i, prefixes[j], budgets[j], keys[j], offsets[j]) for j, i in enumerate(todo)]
            self._stream.submit(new)  # under the lock: rows enter the inbox in tag order

    def step(self) -> list[Sample]:
        """The streaming contract's ``step``: the rows that ended in it, continued."""
        return [sample for _, sample in self._stream_step(None)]

    def _stream_step(self, admit_below: int | None) -> list[tuple[int, Sample]]:
        with self._stream_lock:
            if not self._gate.held or self._gate.key is None:
                return []
            params = self._gate.key[0]
            done = [(t, s) for t, s in self._ready if admit_below is None or t < admit_below]
            self._ready = [(t, s) for t, s in self._ready if admit_below is not None and t >= admit_below]
        ended = self._stream.step(params, admit_below)
        with self._stream_lock:
            for row, reason in ended:
                done.append((row.tag, self._continued(row, reason)))
            self._gate.release(len(done))
        return done

    def _continued(self, row: StreamRow, reason: str) -> Sample:
        """The submitted sample of ``row`` with its new tokens appended (call under ``_stream_lock``)."""
        versions = [self.version] * len(row.tokens)
        return extend_sample(self._streamed.pop(row.tag), row.tokens, row.logprobs, versions, reason, self.tokenizer)

    def interrupt(self) -> list[Sample]:
        """The streaming contract's ``interrupt``: every row not yet reported, in submission order (ones that needed
        no decoding in their final form)."""
        with self._stream_lock:
            out = self._ready + [(row.tag, self._continued(row, "interrupted")) for row in self._stream.interrupt()]
            self._ready = []
            self._gate.release(len(out))
        return [sample for _, sample in sorted(out, key=lambda item: item[0])]

    def drain(self) -> list[Sample]:
        """Step until every row submitted before this call has ended; returns them in the order they ended (rows
        submitted meanwhile wait for the next ``step``)."""
        with self._stream_lock:
            limit = self._next_tag
        out: list[Sample] = []
        while True:
            with self._stream_lock:
                left = any(t < limit for t in self._streamed) or any(t < limit for t, _ in self._ready)
            if not left:
                return out
            out += [sample for _, sample in self._stream_step(limit)]

    def take_prefill(self) -> PrefillStats:
        return self._stream.take_prefill()

    # ---------------------------------------------------------------------------------------------------- weights

    def state_dict_for_sync(self) -> dict[str, torch.Tensor]:
        """Parameter name -> tensor (the live parameters, detached) that a weight sync must cover: tied ones once,
        under their first name (``update_weights`` accepts either); a LoRA model's adapter tensors only."""
        synced = synced_tensors(self.model)
        return sync_layout(synced) if self.quantization == "fp8" else synced

    def update_weights(self, named_tensors: Named, version: int, strict: bool = True) -> None:
        """Copy ``named_tensors`` into the model's parameters in place, then set ``version``. Every name and shape is
        checked before anything is copied (a bad update changes nothing); ``strict``: every parameter of
        ``state_dict_for_sync()`` must be present (a partial sync would mix versions). EngineBusyError during a
        generate/resume or while streamed rows are held (``interrupt`` or ``drain`` first)."""
        required = {n: self._params[n] for n in synced_tensors(self.model)}
        fp8, lora, where = self.quantization == "fp8", is_lora(self.model), f"RolloutEngine.update_weights({version=})"
        items = checked_whole(named_tensors, self._params, required, strict, where, fp8, lora)
        self.update_weights_streamed([items], version, strict, fp8=False)  # dequantized already

    def update_weights_streamed(self, buckets: Iterable[Items], version: int, strict=True, fp8: bool | None = None):
        """``update_weights`` fed bucket by bucket as a weight sync arrives (``asyncrl.rollout.bucket_update``): a
        failure after a copy leaves the engine refusing to generate until the next complete update."""
        where = f"RolloutEngine.update_weights({version=})"
        with self._gate.updating(version), merged_update(self.model), Applying(self._gate, where) as applying:
            required = {n: self._params[n] for n in synced_tensors(self.model)}
            known = required if is_lora(self.model) else self._params  # a LoRA sync carries the adapter alone
            fp8 = self.quantization == "fp8" if fp8 is None else fp8
            for items in checked_buckets(buckets, known, required, strict, where, fp8):
                applying.applied += copy_into(self._params, items)
                del items  # the sync's bucket goes before the next is received
            self.version = version
