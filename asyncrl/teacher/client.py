"""Client for a teacher server: top-k log-probs of token sequences, with bounded concurrency and retries.

The teacher is anything that speaks vLLM's ``/v1/completions`` with ``prompt_logprobs`` (``asyncrl serve-teacher`` or
``vllm serve``). Each sequence is one request (the server batches concurrent ones), sent as
``{"prompt": ids, "max_tokens": 1, "prompt_logprobs": k, "temperature": 0}``: ``max_tokens=1`` because vLLM rejects
``max_tokens=0`` without ``echo``; the one generated token is ignored (so sequences must be shorter than the teacher's
``max_model_len``).

The failure policy (retries with back-off, then :class:`TeacherUnavailableError` naming the URL; HTTP 4xx at once as
:class:`TeacherRequestError`) and the kept-alive connections, one per worker thread, are :mod:`asyncrl.http_json`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING

from asyncrl.config import TeacherConfig
from asyncrl.config.training import TOKENIZER_CHECKS
from asyncrl.http_json import ErrorKinds, JsonHttpClient
from asyncrl.teacher.protocol import (
    TeacherRequestError,
    TeacherResponseError,
    TeacherUnavailableError,
    TokenizerMismatchError,
    TopK,
    decode_text,
    tokenizer_fingerprint,
    topk_from_prompt_logprobs,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

ERRORS = ErrorKinds(TeacherUnavailableError, TeacherRequestError, TeacherResponseError)
PROBE_TOKENS = 256  # student ids sent by the probe check (evenly spread over the vocabulary, the last id included)


class TeacherClient:
    """Scores token sequences on a teacher server; thread-safe.

    ``url`` is the server root (``http://127.0.0.1:8000``; a trailing ``/v1`` is accepted). ``top_k`` ids per position
    are returned; ``max_in_flight`` bounds concurrent requests (worker threads); ``timeout_s`` bounds, in seconds, each
    connect and each wait for bytes of a reply; ``model`` is sent as the request's ``model`` (vLLM needs it only
    when it serves several models, or for old versions).
    """

    def __init__(
        self,
        url: str,
        top_k: int,
        max_in_flight: int = TeacherConfig.max_in_flight,
        timeout_s: float = TeacherConfig.timeout_s,
        max_retries: int = TeacherConfig.max_retries,
        backoff_s: float = TeacherConfig.backoff_s,
        model: str | None = None,
        before_retry: Callable[[], object] | None = None,
    ) -> None:
        if top_k < 1:
            raise ValueError(f"TeacherClient: top_k must be >= 1 (got {top_k})")
        if max_in_flight < 1:
            raise ValueError(f"TeacherClient: max_in_flight must be >= 1 (got {max_in_flight})")
        try:
            self._http = JsonHttpClient(
                url, timeout_s, max_retries, backoff_s, "teacher", ERRORS, strip_suffix="/v1", before_retry=before_retry
            )
        except ValueError as e:
            raise ValueError(f"TeacherClient: {e}") from None
        self.url, self.top_k = self._http.url, top_k
        self._model = {"model": model} if model is not None else {}  # in every POST body
        self._pool = ThreadPoolExecutor(max_in_flight, thread_name_prefix="teacher-client")  # threads start on demand

    # ---- public API --------------------------------------------------------------------------------------------
    def topk(self, prompts_and_responses: list[list[int]]) -> list[TopK]:
        """One :class:`TopK` per sequence (in order), requested concurrently, at most ``max_in_flight`` at a time."""
        futures = [self._pool.submit(self.score, seq) for seq in prompts_and_responses]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for f in pending:
            f.cancel()
        for f in futures:  # the first failure in sequence order, so errors are reproducible
            if f in done and f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        return [f.result() for f in futures]

    def score(self, tokens: list[int]) -> TopK:
        """The teacher's top-k for one sequence (blocking, in the caller's thread)."""
        if not tokens:
            raise ValueError("TeacherClient.score: a sequence needs at least one token")
        body = {"prompt": [int(t) for t in tokens], "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": self.top_k}
        reply = self._http.request("POST", "/v1/completions", {**self._model, **body})
        choices = reply.get("choices") if isinstance(reply, dict) else None
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            raise TeacherResponseError(f"teacher at {self.url}: /v1/completions reply has no single choice")
        where = f"teacher at {self.url} ({len(tokens)}-token sequence)"
        return topk_from_prompt_logprobs(choices[0].get("prompt_logprobs"), list(tokens), self.top_k, where)

    def models(self) -> dict[str, object]:
        """The first entry of ``GET /v1/models`` (id, ``max_model_len``; our server adds vocabulary fields)."""
        reply = self._http.request("GET", "/v1/models")
        data = reply.get("data") if isinstance(reply, dict) else None
        if not isinstance(data, list) or not data or not isinstance(data[0], dict):
            raise TeacherResponseError(f"teacher at {self.url}: /v1/models lists no model")
        return data[0]

    def check_compatible(self, student_tokenizer: PreTrainedTokenizerBase, method: str = "auto") -> dict[str, object]:
        """Check that the teacher's token ids mean the same tokens as the student's; raise if not.

        ``"fingerprint"`` (our server): the teacher's ``/v1/models`` entry carries ``tokenizer_fingerprint``, a hash of
        its whole ``(token, id)`` table; it must equal the student's. ``"probe"`` (any vLLM-compatible server): the
        student's highest id and :data:`PROBE_TOKENS` ids spread over its vocabulary are scored (the teacher must
        accept them: its vocabulary is at least as large) and ``POST /detokenize``-d (the text must equal the
        student's decoding; skipped, and said so in the result, if the server has no ``/detokenize``). ``"auto"``
        uses the fingerprint when offered, else the probe. Returns what was checked plus the teacher's id and
        ``max_model_len``; raises :class:`TokenizerMismatchError` naming both sides.
        """
        if method not in TOKENIZER_CHECKS:
            raise ValueError(f"check_compatible: method must be one of {', '.join(TOKENIZER_CHECKS)} (got {method!r})")
        info = self.models()
        teacher = f"teacher at {self.url} (model {info.get('id')!r})"
        student = (
            f"student tokenizer {getattr(student_tokenizer, 'name_or_path', '') or type(student_tokenizer).__name__}"
        )
        checked: list[str] = []
        result = {"model": info.get("id"), "max_model_len": info.get("max_model_len"), "checked": checked}
        fingerprint = info.get("tokenizer_fingerprint")
        if method == "fingerprint" and fingerprint is None:
            raise TeacherResponseError(f"{teacher}: /v1/models has no tokenizer_fingerprint (use method='probe')")
        if method != "probe" and fingerprint is not None:
            mine = tokenizer_fingerprint(student_tokenizer)
            if fingerprint != mine:
                raise TokenizerMismatchError(
                    f"{teacher} and {student} have different vocabularies: teacher {info.get('tokenizer_len')} "
                    f"tokens ({str(fingerprint)[:23]}), student {len(student_tokenizer)} tokens ({mine[:23]}); "
                    "distillation needs the same token ids on both sides"
                )
            checked.append("fingerprint")
            return result
        size = len(student_tokenizer)
        step = max(1, size // PROBE_TOKENS)
        max_len = info.get("max_model_len")
        limit = max(1, (max_len if isinstance(max_len, int) and max_len else PROBE_TOKENS + 2) - 2)
        probe = (list(range(0, size, step))[: PROBE_TOKENS - 1] + [size - 1])[-limit:]
        try:
            self._http.request("POST", "/v1/completions", {**self._model, "prompt": probe, "max_tokens": 1})
        except TeacherRequestError as e:
            raise TokenizerMismatchError(
                f"{teacher} rejects token ids of the {student} ({size} tokens); its vocabulary is smaller? {e}"
            ) from e
        checked.append(f"student ids 0..{size - 1} accepted")
        try:
            reply = self._http.request("POST", "/detokenize", {**self._model, "tokens": probe})
            text = reply.get("prompt") if isinstance(reply, dict) else None
        except TeacherRequestError as e:
            if e.status != 404:
                raise
            logger.warning("%s has no /detokenize: only the vocabulary size was checked", teacher)
            return result
        mine = decode_text(student_tokenizer, probe)
        if text != mine:
            raise TokenizerMismatchError(
                f"{teacher} and {student} decode the same {len(probe)} probe ids differently: "
                f"teacher {text!r:.120}, student {mine!r:.120}; distillation needs the same token ids on both sides"
            )
        checked.append(f"detokenize of {len(probe)} probe ids")
        return result

    def close(self) -> None:
        """Stop the worker threads and close kept-alive connections."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._http.close()

    def __enter__(self) -> TeacherClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
