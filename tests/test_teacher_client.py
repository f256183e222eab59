"""The teacher client: top-k tensors from a real server, timeouts, retries, 400s, vocabulary checks."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncrl.models.loading import load_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.teacher.client import TeacherClient
from asyncrl.teacher.protocol import (
    TeacherRequestError,
    TeacherResponseError,
    TeacherUnavailableError,
    TokenizerMismatchError,
)
from asyncrl.teacher.server import TeacherServer
from tests.test_teacher_server import TEXTS, build_teacher_dir

FAST = dict(timeout_s=5.0, max_retries=3, backoff_s=0.01)  # retries in milliseconds, not seconds

# A reply in vLLM's format for the sequence [3, 5, 7] with prompt_logprobs=2: at position 1 the actual token is in
# the top 2 (2 entries), at position 2 it is not (3 entries) and ties with the 2nd (which must win).
CANNED_TOKENS = [3, 5, 7]
CANNED = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 0,
    "model": "fake",
    "choices": [
        {
            "index": 0,
            "text": "",
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
            "prompt_logprobs": [
                None,
                {
                    "5": {"logprob": -0.5, "rank": 1, "decoded_token": "a"},
                    "9": {"logprob": -1.5, "rank": 2, "decoded_token": "b"},
                },
                {
                    "7": {"logprob": -3.0, "rank": 3, "decoded_token": "c"},
                    "2": {"logprob": -0.25, "rank": 1, "decoded_token": "d"},
                    "8": {"logprob": -3.0, "rank": 2, "decoded_token": "e"},
                },
            ],
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


def generic_reply(tokens: list[int], k: int) -> dict:
    """A valid vLLM-format reply for any sequence: the actual token ranked first, then k-1 other ids."""
    plp: list[Any] = [None]
    for tok in tokens[1:]:
        entry = {str(tok): {"logprob": -0.1, "rank": 1, "decoded_token": "?"}}
        entry.update({str(10_000 + j): {"logprob": -5.0 - j, "rank": j + 2, "decoded_token": "?"} for j in range(k)})
        plp.append(entry)
    return {"choices": [{"index": 0, "text": "", "prompt_logprobs": plp}]}


Reply = tuple[int, Any]  # (status, JSON body)


@contextmanager
def fake_teacher(answer: Callable[[int, str, Any], Reply], delay_s: float = 0.0) -> Iterator[tuple[str, list]]:
    """A stdlib HTTP server on loopback; ``answer(call_number, path, body)`` decides each reply."""
    calls: list[tuple[str, Any]] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            with lock:
                calls.append((self.path, body))
                n = len(calls)
            if delay_s:
                time.sleep(delay_s)
            status, obj = answer(n, self.path, body)
            data = json.dumps(obj).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:  # the client gave up (timeout test)
                pass

        do_GET = do_POST = _answer

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", calls
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_teacher_dir(tmp_path_factory.mktemp("distill_client"))


@pytest.fixture(scope="module")
def server(teacher_dir: Path):
    with TeacherServer(teacher_dir, max_batch=4, max_wait_ms=5) as s:
        yield s


def test_topk_equals_a_direct_forward_pass_of_the_teacher(server, teacher_dir):
    model, tok = load_model(teacher_dir, for_training=False)
    seqs = [tok(text)["input_ids"] for text in ("h", "hello", "the quick brown fox", "0123456789+-=" * 3)]
    k = 4
    with TeacherClient(server.url, top_k=k, max_in_flight=3, **FAST) as client:
        out = client.topk(seqs)
    assert len(out) == len(seqs)
    for ids, res in zip(seqs, out):
        with torch.no_grad():
            ref = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)[:-1]
        assert res.ids_TK.dtype == torch.long and res.logp_TK.dtype == torch.float32
        assert res.ids_TK.shape == res.logp_TK.shape == (len(ids) - 1, k)
        values, indices = ref.topk(k, dim=-1)
        assert torch.equal(res.ids_TK, indices)
        torch.testing.assert_close(res.logp_TK, values, atol=1e-4, rtol=0)
        targets = torch.tensor(ids[1:]).unsqueeze(1)
        torch.testing.assert_close(res.token_logp_T, ref.gather(1, targets).squeeze(1), atol=1e-4, rtol=0)


def test_canned_vllm_reply_is_parsed_by_rank_dropping_an_actual_token_outside_the_top_k():
    with fake_teacher(lambda n, path, body: (200, CANNED)) as (url, calls):
        with TeacherClient(url, top_k=2, **FAST) as client:
            (res,) = client.topk([CANNED_TOKENS])
    assert res.ids_TK.tolist() == [[5, 9], [2, 8]]
    assert res.logp_TK.tolist() == [[-0.5, -1.5], [-0.25, -3.0]]
    assert res.token_logp_T.tolist() == [-0.5, -3.0]
    (path, body) = calls[0]
    assert path == "/v1/completions"
    assert body == {"prompt": CANNED_TOKENS, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 2}


def test_concurrent_requests_never_exceed_max_in_flight():
    in_flight, peak, lock = [0], [0], threading.Lock()

    def answer(n: int, path: str, body: Any) -> Reply:
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        time.sleep(0.02)
        with lock:
            in_flight[0] -= 1
        return 200, generic_reply(body["prompt"], 2)

    seqs = [[1, 2, 3 + i] for i in range(8)]
    with fake_teacher(answer) as (url, calls):
        with TeacherClient(url, top_k=2, max_in_flight=2, **FAST) as client:
            out = client.topk(seqs)
    assert len(calls) == 8 and 1 <= peak[0] <= 2
    assert [r.ids_TK[:, 0].tolist() for r in out] == [s[1:] for s in seqs]  # answers come back in order


def test_slow_teacher_times_out_and_names_the_url():
    with fake_teacher(lambda n, path, body: (200, CANNED), delay_s=1.0) as (url, calls):
        client = TeacherClient(url, top_k=2, timeout_s=0.2, max_retries=1, backoff_s=0.01)
        with pytest.raises(
            TeacherUnavailableError, match=rf"teacher at {url} unreachable after 1 retries: .*timed out"
        ):
            client.topk([CANNED_TOKENS])
        client.close()
    assert len(calls) == 2  # the first try and one retry


def test_503s_are_retried_until_the_teacher_answers():
    def answer(n: int, path: str, body: Any) -> Reply:
        return (503, {"error": {"message": "warming up"}}) if n <= 2 else (200, CANNED)

    with fake_teacher(answer) as (url, calls):
        with TeacherClient(url, top_k=2, **FAST) as client:
            (res,) = client.topk([CANNED_TOKENS])
    assert len(calls) == 3 and res.ids_TK.tolist() == [[5, 9], [2, 8]]


def test_teacher_that_stays_down_raises_an_error_naming_the_url():
    with socket.socket() as sock:  # a port that nothing listens on (bound, then released)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with TeacherClient(url, top_k=2, timeout_s=0.5, max_retries=2, backoff_s=0.01) as client:
        with pytest.raises(
            TeacherUnavailableError, match=rf"teacher at {url} unreachable after 2 retries: .*Connection"
        ):
            client.topk([[1, 2, 3]])


def test_400_is_not_retried_and_carries_the_servers_message():
    error = {"error": {"message": "prompt_logprobs must be at most 20", "param": "prompt_logprobs", "code": 400}}
    with fake_teacher(lambda n, path, body: (400, error)) as (url, calls):
        with TeacherClient(url, top_k=50, **FAST) as client:
            with pytest.raises(TeacherRequestError, match="HTTP 400.*must be at most 20 \\(param 'prompt_logprobs'\\)"):
                client.topk([[1, 2, 3]])
    assert len(calls) == 1


def test_real_server_rejection_is_raised_at_once(server):
    with TeacherClient(server.url, top_k=2, **FAST) as client:
        with pytest.raises(TeacherRequestError, match=r"token id 100000 is out of the vocabulary"):
            client.topk([[1, 2], [1, 100_000]])


def test_reply_without_the_actual_token_names_the_position():
    bad = json.loads(json.dumps(CANNED))
    del bad["choices"][0]["prompt_logprobs"][2]["7"]
    with fake_teacher(lambda n, path, body: (200, bad)) as (url, _):
        with TeacherClient(url, top_k=2, **FAST) as client:
            with pytest.raises(TeacherResponseError, match=r"prompt_logprobs\[2\] lacks the actual token id 7"):
                client.topk([CANNED_TOKENS])


def test_single_token_sequence_has_no_positions(server):
    with TeacherClient(server.url, top_k=3, **FAST) as client:
        (res,) = client.topk([[4]])
    assert res.ids_TK.shape == (0, 3) and res.token_logp_T.shape == (0,)


def test_kept_alive_connection_to_a_restarted_teacher_is_reopened_without_a_retry(teacher_dir):
    first = TeacherServer(teacher_dir).start()
    port = first.port
    with TeacherClient(first.url, top_k=2, max_in_flight=1, timeout_s=5.0, max_retries=0) as client:
        client.topk([[1, 2, 3]])
        first.stop()
        with TeacherServer(teacher_dir, port=port) as second:
            (res,) = client.topk([[1, 2, 3]])
            assert second.stats["sequences"] == 1 and res.ids_TK.shape == (2, 2)


@pytest.mark.parametrize("method", ["auto", "fingerprint", "probe"])
def test_check_compatible_accepts_the_teachers_own_tokenizer(server, teacher_dir, method):
    _, tok = load_model(teacher_dir, for_training=False)
    with TeacherClient(server.url, top_k=2, **FAST) as client:
        info = client.check_compatible(tok, method=method)
    assert info["model"] == server.model_id and info["max_model_len"] == 512
    assert info["checked"][0] == ("fingerprint" if method != "probe" else f"student ids 0..{len(tok) - 1} accepted")


def test_check_compatible_detects_a_different_vocabulary(server):
    chars = sorted(set("".join(TEXTS)))
    same_size = build_char_tokenizer(["".join(chars[:-1]) + "~"])  # one character differs: same size, other ids
    larger = build_char_tokenizer(TEXTS + ["ABC"])
    assert len(same_size) == server.vocab_size and len(larger) > server.vocab_size
    with TeacherClient(server.url, top_k=2, **FAST) as client:
        for student in (same_size, larger):
            with pytest.raises(TokenizerMismatchError, match=rf"teacher at {server.url} .*student tokenizer"):
                client.check_compatible(student)
        with pytest.raises(TokenizerMismatchError, match="decode the same .* probe ids differently"):
            client.check_compatible(same_size, method="probe")
        with pytest.raises(TokenizerMismatchError, match="rejects token ids .*out of the vocabulary"):
            client.check_compatible(larger, method="probe")


def test_check_compatible_against_a_vllm_like_server_checks_what_it_can(server, teacher_dir):
    """No fingerprint in /v1/models and no /detokenize (404): only the vocabulary size is checked."""
    _, tok = load_model(teacher_dir, for_training=False)

    def answer(n: int, path: str, body: Any) -> Reply:
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": "vllm-model", "object": "model", "max_model_len": 64}]}
        if path == "/v1/completions":
            return 200, generic_reply(body["prompt"], 0)
        return 404, {"detail": "Not Found"}

    with fake_teacher(answer) as (url, calls):
        with TeacherClient(url, top_k=2, **FAST) as client:
            info = client.check_compatible(tok)
    assert info == {"model": "vllm-model", "max_model_len": 64, "checked": [f"student ids 0..{len(tok) - 1} accepted"]}
    probe = calls[1][1]["prompt"]
    assert len(probe) <= 62 and probe[-1] == len(tok) - 1
