"""collate / micro-batching: trimming padding and regrouping rows by length never changes what the model computes."""

from __future__ import annotations

import torch

from asyncrl.data.collate import collate, micro_batches
from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.trainer.forward import response_logprobs
from asyncrl.types import Prompt, Sample


def _samples(tok) -> list[Sample]:
    texts = [("1 + 2 =", "3"), ("45 - 7 + 11 =", "49 then more"), ("9 =", ""), ("3 - 3 =", "0")]
    out = []
    for i, (p, r) in enumerate(texts):
        pid = tok(p, add_special_tokens=False)["input_ids"]
        rid = tok(r, add_special_tokens=False)["input_ids"]
        out.append(Sample(Prompt(i, pid, "chain_sum", "0"), rid, [-0.5] * len(rid), [0] * len(rid)))
    return out


def test_collate_aligns_every_response_at_the_same_column():
    tok = build_char_tokenizer(["0123456789 +-=thenmor"])
    samples = _samples(tok)
    b = collate(samples, tok.pad_token_id)
    P = b.prompt_width
    assert P == max(len(s.prompt.prompt_ids) for s in samples)
    for i, s in enumerate(samples):
        n = len(s.response_ids)
        assert b.input_ids_BL[i, P : P + n].tolist() == s.response_ids
        assert b.response_mask_BT[i].sum() == n
        assert b.input_ids_BL[i, P - len(s.prompt.prompt_ids) : P].tolist() == s.prompt.prompt_ids
        # positions count real tokens only, as the rollout engine numbers them
        assert b.position_ids_BL[i, P - len(s.prompt.prompt_ids)] == 0


def test_micro_batches_cover_every_row_once_and_trim_padding():
    tok = build_char_tokenizer(["0123456789 +-=thenmor"])
    b = collate(_samples(tok), tok.pad_token_id)
    parts = micro_batches(b, 2)
    rows = sorted(int(i) for idx, _ in parts for i in idx)
    assert rows == [0, 1, 2, 3]
    widths = [mb.input_ids_BL.shape[1] for _, mb in parts]
    assert min(widths) < b.input_ids_BL.shape[1]  # the short-response micro-batch is narrower
    assert micro_batches(b.select([]), 2) == []  # no rows, no micro-batches (the update may leave out every row)


def test_logprobs_are_the_same_with_or_without_micro_batching():
    tok = build_char_tokenizer(["0123456789 +-=thenmor"])
    model = build_model("micro", tok, seed=0)
    b = collate(_samples(tok), tok.pad_token_id)
    whole = response_logprobs(model, b, temperature=1.0, how=64)
    split = response_logprobs(model, b, temperature=1.0, how=1)
    assert torch.allclose(whole, split, atol=1e-5)
    assert (whole[b.response_mask_BT == 0] == 0).all()
    assert (whole[b.response_mask_BT == 1] < 0).all()
