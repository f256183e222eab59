"""The teacher server: vLLM's /v1/completions reply shape, numbers equal to a direct forward pass, batching, 400s."""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncrl.models.loading import ModelLoadError, load_model
from asyncrl.models.presets import init_model_dir
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.teacher.server import TeacherServer, add_arguments, main

TEXTS = ["hello world 0123456789+-=", "the quick brown fox jumps"]


def build_teacher_dir(root: Path, texts: list[str] = TEXTS, seed: int = 0) -> Path:
    """A micro Qwen2 with a character tokenizer over ``texts``: a real HF directory, made in well under a second."""
    out = root / "teacher"
    init_model_dir("micro", build_char_tokenizer(texts), out, seed=seed)
    return out


def request(url: str, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
    """One HTTP exchange; returns (status, decoded JSON)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def complete(url: str, body: Any) -> dict:
    status, reply = request(url, "POST", "/v1/completions", body)
    assert status == 200, reply
    return reply


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_teacher_dir(tmp_path_factory.mktemp("distill_server"))


@pytest.fixture(scope="module")
def server(teacher_dir: Path):
    with TeacherServer(teacher_dir, max_batch=4, max_wait_ms=20) as s:
        yield s


@pytest.fixture(scope="module")
def reference(teacher_dir: Path):
    """The same model loaded directly, and a function giving its full-vocabulary log-probs for one sequence."""
    model, tok = load_model(teacher_dir, for_training=False)

    def logp_LV(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)

    return logp_LV, tok


def test_prompt_logprobs_have_vllm_shape_and_equal_a_direct_forward_pass(server, reference):
    logp_LV, tok = reference
    ids = tok("hello world")["input_ids"]
    k = 3
    reply = complete(server.url, {"prompt": ids, "max_tokens": 0, "prompt_logprobs": k})
    reply = json.loads(json.dumps(reply))  # as a client sees it: JSON keys are strings
    plp = reply["choices"][0]["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    ref = logp_LV(ids)
    for t in range(1, len(ids)):
        entry, row = plp[t], ref[t - 1]
        assert all(isinstance(key, str) and key.isdigit() for key in entry)
        actual = entry[str(ids[t])]
        assert list(entry)[0] == str(ids[t])  # vLLM puts the prompt token first
        assert actual["logprob"] == pytest.approx(row[ids[t]].item(), abs=1e-4)
        assert actual["decoded_token"] == tok.decode([ids[t]])
        top_values, top_ids = row.topk(k)
        ranked = sorted(entry.items(), key=lambda kv: kv[1]["rank"])
        top = [(key, v) for key, v in ranked if v["rank"] <= k]
        assert [int(key) for key, _ in top] == top_ids.tolist()
        assert [v["rank"] for _, v in top] == [1, 2, 3]
        logps = [v["logprob"] for _, v in top]
        assert logps == sorted(logps, reverse=True)
        assert logps == pytest.approx(top_values.tolist(), abs=1e-4)
        if ids[t] in top_ids.tolist():
            assert len(entry) == k
        else:
            assert len(entry) == k + 1
            assert actual["rank"] == int((row >= row[ids[t]]).sum())


def test_reply_carries_the_openai_completion_fields(server):
    reply = complete(server.url, {"model": "my-teacher", "prompt": [7, 8, 9], "prompt_logprobs": 0})
    assert reply["id"].startswith("cmpl-") and reply["object"] == "text_completion"
    assert isinstance(reply["created"], int) and reply["model"] == "my-teacher"
    assert reply["usage"] == {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3}
    choice = reply["choices"][0]
    assert choice["index"] == 0 and choice["text"] == "" and choice["logprobs"] is None
    assert [len(e) for e in choice["prompt_logprobs"][1:]] == [1, 1]  # k=0: only the actual token
    assert complete(server.url, {"prompt": [7, 8]})["choices"][0]["prompt_logprobs"] is None


def test_max_tokens_one_generates_the_greedy_token_with_its_logprobs(server, reference):
    logp_LV, tok = reference
    ids = tok("the quick")["input_ids"]
    reply = complete(server.url, {"prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": 2})
    choice = reply["choices"][0]
    last = logp_LV(ids)[-1]
    greedy = int(last.argmax())
    assert choice["text"] == tok.decode([greedy]) and choice["finish_reason"] in ("length", "stop")
    assert choice["logprobs"]["token_logprobs"] == pytest.approx([last[greedy].item()], abs=1e-4)
    assert len(choice["logprobs"]["top_logprobs"][0]) <= 3
    assert reply["usage"]["completion_tokens"] == 1


def test_echo_of_a_text_prompt_prepends_the_prompt(server, reference):
    _, tok = reference
    reply = complete(server.url, {"prompt": "hello", "max_tokens": 0, "echo": True, "logprobs": 1})
    choice = reply["choices"][0]
    assert choice["text"] == "hello"
    assert choice["logprobs"]["tokens"] == list("hello")
    assert choice["logprobs"]["token_logprobs"][0] is None
    assert len(choice["prompt_logprobs"]) == len(tok("hello")["input_ids"])


def test_a_list_of_prompts_gets_one_choice_per_prompt_in_order(server, reference):
    logp_LV, tok = reference
    prompts = [tok(text)["input_ids"] for text in ("fox", "hello world 42", "jumps")]
    reply = complete(server.url, {"prompt": prompts, "prompt_logprobs": 1})
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2]
    for ids, choice in zip(prompts, reply["choices"]):
        ref = logp_LV(ids)
        got = [choice["prompt_logprobs"][t][str(ids[t])]["logprob"] for t in range(1, len(ids))]
        assert got == pytest.approx([ref[t - 1, ids[t]].item() for t in range(1, len(ids))], abs=1e-4)


def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(teacher_dir, reference):
    logp_LV, tok = reference
    prompts = [tok(text)["input_ids"] for text in ("x", "hello world", "quick brown fox", "0123456789+-=")]
    # A long wait makes the batcher hold the first sequence until all four have arrived (a full batch runs at once).
    with TeacherServer(teacher_dir, max_batch=4, max_wait_ms=2000) as s:
        complete(s.url, {"prompt": prompts, "prompt_logprobs": 2})
        assert s.stats["max_batch_size"] == 4  # four prompts of one request: queued together, one forward pass
        replies: list[Any] = [None] * len(prompts)

        def send(i: int) -> None:
            replies[i] = complete(s.url, {"prompt": prompts[i], "prompt_logprobs": 2})

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert s.stats["sequences"] == 8
    for ids, reply in zip(prompts, replies):
        plp = reply["choices"][0]["prompt_logprobs"]
        ref = logp_LV(ids)
        assert len(plp) == len(ids)
        for t in range(1, len(ids)):
            assert plp[t][str(ids[t])]["logprob"] == pytest.approx(ref[t - 1, ids[t]].item(), abs=1e-4)


@pytest.mark.parametrize(
    "body, param",
    [
        (b"{not json", "body"),
        ([1, 2, 3], "body"),
        ({"max_tokens": 0}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": {"ids": [1]}}, "prompt"),
        ({"prompt": [1, "2"]}, "prompt"),
        ({"prompt": [1, 10_000]}, "prompt"),
        ({"prompt": [-1]}, "prompt"),
        ({"prompt": [1] * 600}, "prompt"),
        ({"prompt": [1], "max_tokens": 2}, "max_tokens"),
        ({"prompt": [1], "max_tokens": "1"}, "max_tokens"),
        ({"prompt": [1], "prompt_logprobs": "x"}, "prompt_logprobs"),
        ({"prompt": [1], "prompt_logprobs": -1}, "prompt_logprobs"),
        ({"prompt": [1], "prompt_logprobs": True}, "prompt_logprobs"),
        ({"prompt": [1], "logprobs": 1.5}, "logprobs"),
        ({"prompt": [1], "echo": "yes"}, "echo"),
        ({"prompt": [1], "temperature": -0.5}, "temperature"),
        ({"prompt": [1], "model": 3}, "model"),
        ({"prompt": [1], "stream": True}, "stream"),
        ({"prompt": [1], "n": 2}, "n"),
    ],
)
def test_malformed_request_gets_400_naming_the_field(server, body, param):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, reply = request(server.url, "POST", "/v1/completions", raw=raw)
    assert status == 400
    assert reply["error"]["param"] == param and reply["error"]["type"] == "invalid_request_error"
    assert param in reply["error"]["message"] or param == "body" and "JSON" in reply["error"]["message"]


def test_out_of_vocabulary_and_too_long_messages_say_the_limits(server):
    _, reply = request(server.url, "POST", "/v1/completions", {"prompt": [[1, 2], [3, 10_000]]})
    assert reply["error"]["message"] == (
        f"prompt[1][1]: token id 10000 is out of the vocabulary (ids 0..{server.vocab_size - 1})"
    )
    _, reply = request(server.url, "POST", "/v1/completions", {"prompt": [1] * 512, "max_tokens": 1})
    assert "maximum context length is 512 tokens" in reply["error"]["message"]


def test_health_and_models_name_the_model_and_its_vocabulary(server):
    assert request(server.url, "GET", "/health") == (200, {"status": "ok", "model": server.model_id})
    status, models = request(server.url, "GET", "/v1/models")
    assert status == 200 and models["object"] == "list"
    (entry,) = models["data"]
    assert entry["id"] == server.model_id and entry["object"] == "model" and entry["max_model_len"] == 512
    assert entry["vocab_size"] == server.vocab_size and entry["tokenizer_fingerprint"].startswith("sha256:")


def test_tokenize_and_detokenize_round_trip(server):
    status, tok = request(server.url, "POST", "/tokenize", {"prompt": "hello"})
    assert status == 200 and tok["count"] == 5 and tok["max_model_len"] == 512
    assert request(server.url, "POST", "/detokenize", {"tokens": tok["tokens"]}) == (200, {"prompt": "hello"})
    status, reply = request(server.url, "POST", "/detokenize", {"tokens": [10_000]})
    assert status == 400 and reply["error"]["param"] == "tokens"


def test_unknown_route_and_missing_length_get_json_errors(server):
    assert request(server.url, "GET", "/v2/nothing")[0] == 404
    assert request(server.url, "POST", "/v1/chat/completions", {"x": 1})[0] == 404
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n")
        head = sock.recv(4096).decode()
    assert head.startswith("HTTP/1.1 411")


def test_bad_model_dir_fails_at_start_naming_the_path(tmp_path):
    with pytest.raises(ModelLoadError, match=str(tmp_path / "missing")):
        TeacherServer(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        TeacherServer(tmp_path / "empty")


def test_serve_teacher_command_with_a_bad_dir_prints_one_line_and_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--model", str(tmp_path / "missing"), "--port", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("asyncrl serve-teacher: error: model.path") and err.count("\n") == 1


def test_stopped_server_refuses_connections(teacher_dir):
    s = TeacherServer(teacher_dir).start()
    port = s.port
    assert request(s.url, "GET", "/health")[0] == 200
    s.stop()
    s.stop()  # idempotent
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_cli_serve_teacher_flags_match_the_servers():
    """``asyncrl serve-teacher`` takes the server's own flags (declared once, in ``asyncrl.config.training``, which the
    command line imports without the model stack that importing the server would load)."""
    from asyncrl.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    ours = argparse.ArgumentParser()
    add_arguments(ours)

    def flags(p: argparse.ArgumentParser) -> set:
        return {(tuple(a.option_strings), a.default, a.type, a.required) for a in p._actions if a.dest != "help"}

    assert flags(sub.choices["serve-teacher"]) == flags(ours)
