"""``asyncrl serve-teacher``: a teacher that scores token sequences over HTTP, speaking vLLM's completions API.

The format is :mod:`asyncrl.teacher.protocol`'s and the HTTP plumbing :mod:`asyncrl.teacher.transport`'s, so a real
``vllm serve`` can stand in for this server, which runs the built-in transformers model for tiny teachers and tests, on
the standard library only, with no authentication: it binds 127.0.0.1 unless told otherwise.

Concurrent requests are batched: connection threads put one job per prompt on a queue; a single batcher thread takes
the first job, waits up to ``max_wait_ms`` for more (up to ``max_batch`` sequences), runs one right-padded forward
pass, and resolves each job's future. Right padding keeps every real token at the position it has unbatched, so
batched and unbatched scores agree to float rounding. ``GET /v1/models`` adds ``vocab_size`` and
``tokenizer_fingerprint`` to vLLM's list, for the client's check that the student shares the vocabulary.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import queue
import signal
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from asyncrl.config import TeacherConfig
from asyncrl.config.training import add_serve_teacher_arguments as add_arguments
from asyncrl.models.loading import ModelLoadError, eos_token_ids, load_model
from asyncrl.teacher.protocol import (
    RequestError,
    Scored,
    SequenceScores,
    completion_response,
    decode_text,
    parse_completion_request,
    parse_prompts,
    tokenizer_fingerprint,
)
from asyncrl.teacher.transport import Route, ServerStoppingError, TeacherHTTPServer

logger = logging.getLogger(__name__)


@dataclass
class _Job:
    """One sequence to score. ``prompt_k`` None = no prompt log-probs wanted; ``gen_k`` is used only if generating."""

    tokens: list[int]
    prompt_k: int | None
    generate: bool
    gen_k: int
    temperature: float
    seed: int | None
    future: Future = field(default_factory=Future)


def _scored(logp_NV: torch.Tensor, ids: list[int], k: int) -> list[Scored]:
    """Each row's token in ``ids``: its log-prob and rank, and the row's top k (``logp_NV``: [N, V])."""
    actual_N1 = logp_NV.gather(1, torch.tensor(ids, dtype=torch.long).unsqueeze(1))
    rank_N = (logp_NV >= actual_N1).sum(dim=1)  # 1-based: ids at least as likely, itself included
    values, indices = logp_NV.topk(k, dim=-1)
    return list(zip(ids, actual_N1.squeeze(1).tolist(), rank_N.tolist(), indices.tolist(), values.tolist()))


def _score(logp_LV: torch.Tensor, job: _Job) -> SequenceScores:
    """What ``job`` asks of one sequence's log-probs (``logp_LV``: [L, V]); row ``t`` predicts token ``t + 1``."""
    prompt = None if job.prompt_k is None else _scored(logp_LV[:-1], job.tokens[1:], job.prompt_k)
    gen: Scored | None = None
    if job.generate:
        last = logp_LV[-1]
        if job.temperature == 0:
            tok = int(last.argmax())
        else:
            gen_rng = torch.Generator().manual_seed(job.seed) if job.seed is not None else None
            tok = int(torch.multinomial(torch.softmax(last / job.temperature, -1), 1, generator=gen_rng))
        (gen,) = _scored(logp_LV[-1:], [tok], job.gen_k)
    return SequenceScores(prompt, gen)


class TeacherServer:
    """A batching HTTP teacher over a local Hugging Face causal-LM directory.

    ``max_batch`` caps sequences per forward pass; ``max_wait_ms`` is how long (milliseconds) the batcher waits after
    the first queued sequence for others to join. ``port=0`` picks a free port (read it from ``.port``/``.url`` after
    :meth:`start`). The model id in replies is ``model_name`` or, as in vLLM, the directory as given.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        host: str = "127.0.0.1",
        port: int = 0,
        max_batch: int = TeacherConfig.server_max_batch,
        max_wait_ms: float = 5.0,
        model_name: str | None = None,
        dtype: str = "float32",
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"serve-teacher: max_batch must be >= 1 (got {max_batch})")
        if max_wait_ms < 0:
            raise ValueError(f"serve-teacher: max_wait_ms must be >= 0 (got {max_wait_ms})")
        self.model_dir = os.fspath(model_dir)
        self.model, self.tokenizer = load_model(self.model_dir, dtype=dtype, for_training=False)
        self.model_id = model_name or self.model_dir
        self.vocab_size = int(self.model.get_input_embeddings().num_embeddings)
        self.max_model_len = int(getattr(self.model.config, "max_position_embeddings", 0) or 2**31 - 1)
        self.fingerprint = tokenizer_fingerprint(self.tokenizer)
        self.eos_ids = set(eos_token_ids(self.model, self.tokenizer))
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.host, self.max_batch, self.max_wait_s = host, max_batch, max_wait_ms / 1000.0
        self.created = int(time.time())
        self.stats = {"batches": 0, "sequences": 0, "max_batch_size": 0}
        self._requested_port = port
        self._httpd: TeacherHTTPServer | None = None
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._stopping = False
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._decode_one = functools.cache(lambda tid: decode_text(self.tokenizer, [tid]))

    # ---- lifecycle -------------------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("TeacherServer.port: the server is not started (call start() first)")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> TeacherServer:
        try:
            self._httpd = TeacherHTTPServer((self.host, self._requested_port), self._routes())
        except OSError as e:
            raise OSError(f"serve-teacher: cannot listen on {self.host}:{self._requested_port} ({e})") from e
        if self.host not in ("127.0.0.1", "localhost", "::1"):
            logger.warning("teacher server listens on %s without authentication", self.host)
        self._threads = [
            threading.Thread(target=self._batch_loop, name="teacher-batcher", daemon=True),
            threading.Thread(target=self._httpd.serve_forever, args=(0.1,), name="teacher-http", daemon=True),
        ]
        for t in self._threads:
            t.start()
        logger.info("teacher %s serving at %s", self.model_id, self.url)
        return self

    def stop(self) -> None:
        """Stop accepting, answer what is queued, close open connections. Safe to call twice."""
        with self._lock:
            if self._stopping or self._httpd is None:
                return
            self._stopping = True
            self._queue.put(None)
        self._httpd.shutdown()
        self._httpd.close_connections()
        self._httpd.server_close()
        for t in self._threads:
            t.join(timeout=30)
        self._stopped.set()

    def wait(self) -> None:
        """Block until :meth:`stop` (signals such as Ctrl-C still interrupt the wait)."""
        while not self._stopped.wait(0.5):
            pass

    def __enter__(self) -> TeacherServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- batching --------------------------------------------------------------------------------------------
    def _batch_loop(self) -> None:
        while (job := self._queue.get()) is not None:
            batch, deadline = [job], time.monotonic() + self.max_wait_s
            while len(batch) < self.max_batch:
                remaining = deadline - time.monotonic()
                try:  # past the deadline, still take what is already queued, without waiting
                    nxt = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:  # stop, after this batch (nothing is queued after the None)
                    self._queue.put(None)
                    break
                batch.append(nxt)
            self._run_batch(batch)

    def _run_batch(self, batch: list[_Job]) -> None:
        try:
            lengths = [len(j.tokens) for j in batch]
            ids_BL = torch.full((len(batch), max(lengths)), self.pad_id, dtype=torch.long)
            mask_BL = torch.zeros_like(ids_BL)
            for b, job in enumerate(batch):
                ids_BL[b, : lengths[b]] = torch.tensor(job.tokens, dtype=torch.long)
                mask_BL[b, : lengths[b]] = 1
            with torch.inference_mode():
                logits_BLV = self.model(input_ids=ids_BL, attention_mask=mask_BL, use_cache=False).logits
                results = [
                    _score(torch.log_softmax(logits_BLV[b, : lengths[b]].float(), dim=-1), job)
                    for b, job in enumerate(batch)
                ]
        except Exception as e:  # answer every waiting request rather than leave it hanging
            logger.exception("teacher forward pass failed")
            for job in batch:
                job.future.set_exception(e)
            return
        self.stats["batches"] += 1
        self.stats["sequences"] += len(batch)
        self.stats["max_batch_size"] = max(self.stats["max_batch_size"], len(batch))
        for job, res in zip(batch, results):
            job.future.set_result(res)

    # ---- endpoints (each takes the decoded JSON body and returns the JSON reply) ------------------------------
    def _routes(self) -> dict[str, Route]:
        return {
            "GET /health": lambda _: {"status": "ok", "model": self.model_id},
            "GET /v1/models": lambda _: self.models_payload(),
            "POST /v1/completions": self.complete,
            "POST /tokenize": self.tokenize,
            "POST /detokenize": self.detokenize,
        }

    def _tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def models_payload(self) -> dict[str, object]:
        entry = {
            "id": self.model_id,
            "object": "model",
            "created": self.created,
            "owned_by": "asyncrl",
            "root": self.model_dir,
            "parent": None,
            "max_model_len": self.max_model_len,
            "vocab_size": self.vocab_size,
            "tokenizer_len": len(self.tokenizer),
            "tokenizer_fingerprint": self.fingerprint,
        }
        return {"object": "list", "data": [entry]}

    def complete(self, body: object) -> dict[str, object]:
        add_special = body.get("add_special_tokens", True) if isinstance(body, dict) else True
        req = parse_completion_request(
            body, self.vocab_size, self.max_model_len, lambda text: self._tokenize(text, bool(add_special))
        )
        jobs = [
            _Job(p, req.prompt_logprobs, req.max_tokens == 1, req.logprobs or 0, req.temperature, req.seed)
            for p in req.prompts
        ]
        with self._lock:
            if self._stopping:
                raise ServerStoppingError("teacher server is shutting down")
            for job in jobs:
                self._queue.put(job)
        scores = [job.future.result() for job in jobs]
        return completion_response(
            req, scores, req.model or self.model_id, self.tokenizer, self.eos_ids, self._decode_one
        )

    def tokenize(self, body: object) -> dict[str, object]:
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            raise RequestError("prompt", "prompt must be a string")
        tokens = self._tokenize(body["prompt"], bool(body.get("add_special_tokens", True)))
        return {"count": len(tokens), "max_model_len": self.max_model_len, "tokens": tokens}

    def detokenize(self, body: object) -> dict[str, object]:
        if not isinstance(body, dict):
            raise RequestError("body", f"request body must be a JSON object (got {type(body).__name__})")
        try:
            (tokens,) = parse_prompts(body.get("tokens"), self.vocab_size, self._tokenize)
        except RequestError as e:
            raise RequestError("tokens", str(e).replace("prompt", "tokens")) from None
        return {"prompt": decode_text(self.tokenizer, tokens)}


# ---- command line ------------------------------------------------------------------------------------------
def run_from_args(a: argparse.Namespace) -> None:
    """Build and start from parsed flags, print one JSON line with the URL, and serve until Ctrl-C / SIGTERM; a bad
    model dir or a busy port prints one line and exits with status 2."""
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        server = TeacherServer(a.model, a.host, a.port, a.max_batch, a.max_wait_ms, a.served_model_name, a.dtype)
        server.start()
    except (ModelLoadError, OSError, ValueError) as e:
        print(f"asyncrl serve-teacher: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps({"teacher": server.url, "model": server.model_id}), flush=True)
    try:
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    p = argparse.ArgumentParser(prog="asyncrl serve-teacher", description=__doc__.splitlines()[0])
    add_arguments(p)
    run_from_args(p.parse_args(argv))


if __name__ == "__main__":
    main()
