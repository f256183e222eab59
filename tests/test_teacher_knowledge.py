"""The teacher's knowledge lands on the right response positions: checked against the teacher model's own forward
pass (a real in-process server on loopback, a real micro model)."""

from __future__ import annotations

import torch

from asyncrl.models.loading import load_model
from asyncrl.teacher.client import TeacherClient
from asyncrl.teacher.knowledge import dataset_responses, get_teacher_knowledge
from asyncrl.teacher.server import TeacherServer
from asyncrl.types import Prompt, Sample
from tests.helpers import make_data, make_model


def _sample(prompt_ids, response_ids, uid_index=0, answer="7"):
    p = Prompt(index=uid_index, prompt_ids=prompt_ids, data_source="chain_sum", ground_truth=answer)
    return Sample(
        prompt=p, response_ids=response_ids, logprobs=[0.0] * len(response_ids), versions=[0] * len(response_ids)
    )


def test_rows_predicting_each_response_token_are_aligned_and_padding_is_finite(tmp_path):
    train, _ = make_data(tmp_path)
    teacher_dir = make_model(tmp_path, train, seed=3)
    model, tok = load_model(str(teacher_dir), for_training=False)
    a = tok("3 + 4 =", add_special_tokens=False)["input_ids"]
    b = tok("12 - 5 + 1 =", add_special_tokens=False)["input_ids"]
    samples = [_sample(a, [5, 6, 7], 0), _sample(b, [8], 1)]  # different prompt and response lengths
    K = 3
    with TeacherServer(teacher_dir, max_batch=4) as server:
        with TeacherClient(server.url, top_k=K) as client:
            kn = get_teacher_knowledge(client, samples)
    assert kn.topk_ids_BTK.shape == (2, 3, K) and kn.token_logp_BT.shape == (2, 3)
    for bi, s in enumerate(samples):
        seq = torch.tensor([s.prompt.prompt_ids + s.response_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=seq).logits[0].float(), dim=-1)
        P = len(s.prompt.prompt_ids)
        for j, tid in enumerate(s.response_ids):
            row = logp[P + j - 1]  # the distribution that predicts response token j
            assert torch.allclose(kn.token_logp_BT[bi, j], row[tid], atol=1e-4)
            top = torch.topk(row, K)
            assert kn.topk_ids_BTK[bi, j].tolist() == top.indices.tolist()
            assert torch.allclose(kn.topk_logp_BTK[bi, j], top.values, atol=1e-4)
    # sample 1 has one response token: positions 1 and 2 are padding, a one-hot on id 0 (finite, masked by the loss)
    assert kn.topk_logp_BTK[1, 1:, 0].eq(0).all() and torch.isinf(kn.topk_logp_BTK[1, 1:, 1:]).all()
    assert kn.token_logp_BT[1, 1:].eq(0).all()


def test_dataset_responses_are_the_answers_once_per_prompt(tmp_path):
    train, _ = make_data(tmp_path)
    _, tok = load_model(str(make_model(tmp_path, train)), for_training=False)
    ids = tok("1 + 1 =", add_special_tokens=False)["input_ids"]
    group = [_sample(ids, [5, 6], 0, answer="2"), _sample(ids, [7], 0, answer="2"), _sample(ids, [8], 1, answer="13")]
    out = dataset_responses(group, tok, tok.eos_token_id, max_len=16)
    assert len(out) == 2  # one per distinct prompt
    assert out[0].response_ids == tok("2", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert out[1].response_ids == tok("13", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert out[0].stop_reason == "eos" and len(out[0].logprobs) == len(out[0].response_ids)
    short = dataset_responses(group[2:], tok, tok.eos_token_id, max_len=1)
    assert len(short[0].response_ids) == 1 and short[0].stop_reason == "length"
