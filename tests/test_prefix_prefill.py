"""Identical prefixes are prefilled once: same samples as prefilling every row, fewer rows through the prefill."""

import string
from dataclasses import replace

import pytest
import torch

from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Prompt

TEXTS = ["a", "hello world", "What is 2+2? Think.", "xy", "The quick brown fox"]
PARAMS = SamplingParams(n=4, temperature=1.0, max_new_tokens=10)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny batches: a second intra-op thread only adds sync overhead (and stalls badly on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer([string.printable[:95]])


@pytest.fixture(scope="module")
def model(tok):
    return build_model("micro", tok, seed=0, initializer_range=0.3)


def make_prompts(tok, texts=TEXTS):
    return [Prompt(index=i, prompt_ids=tok.encode(t), data_source="test", ground_truth="") for i, t in enumerate(texts)]


def prefill_rows(model):
    """Record the batch size of every multi-token forward (the prefills: decode steps feed one token per row)."""
    rows: list[int] = []

    def hook(module, args, kwargs):
        ids = kwargs["input_ids"]
        if ids.shape[1] > 1:
            rows.append(ids.shape[0])

    return rows, model.register_forward_pre_hook(hook, with_kwargs=True)


def both(model, tok, call, **kwargs):
    """``call(engine)`` with prefix sharing off and on; returns the two results and the two engines."""
    engines = [RolloutEngine(model, tok, share_prefixes=share, **kwargs) for share in (False, True)]
    return [call(e) for e in engines], engines


def assert_same(plain, shared):
    assert [(s.response_ids, s.stop_reason) for s in shared] == [(s.response_ids, s.stop_reason) for s in plain]
    assert len({tuple(s.response_ids) for s in plain}) > len(plain) // 2  # sampled rows differ: not a constant output
    for a, b in zip(plain, shared):
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-5, rtol=0)


def test_generate_with_n_copies_prefills_each_prompt_once_and_samples_the_same(model, tok):
    prompts = make_prompts(tok)[:3]
    rows, handle = prefill_rows(model)
    try:
        (plain, shared), (e_plain, e_shared) = both(model, tok, lambda e: e.generate(prompts, PARAMS, seed=7))
    finally:
        handle.remove()
    assert_same(plain, shared)
    assert rows == [12, 3]  # unshared prefill: 3 prompts x n=4 rows; shared: one row per prompt
    prompt_tokens = sum(len(p.prompt_ids) for p in prompts)
    assert e_shared.last_prefill.tokens == prompt_tokens
    assert e_shared.last_prefill.unshared_tokens == e_plain.last_prefill.tokens == 4 * prompt_tokens
    assert e_shared.last_prefill.saved_tokens == 3 * prompt_tokens and e_plain.last_prefill.saved_tokens == 0


def test_distinct_prefixes_take_the_plain_path(model, tok):
    rows, handle = prefill_rows(model)
    try:
        (plain, shared), (_, engine) = both(
            model, tok, lambda e: e.generate(make_prompts(tok), replace(PARAMS, n=1), 9)
        )
    finally:
        handle.remove()
    assert_same(plain, shared)
    assert rows == [5, 5] and engine.last_prefill.saved_tokens == 0


def test_resume_of_blank_rows_mixed_with_partial_rows(model, tok):
    """The Rollouter's shape: per group, some rows part-way through a response and the rest prompt-only ("blank")."""
    engine = RolloutEngine(model, tok)
    started = engine.generate(make_prompts(tok)[:3], replace(PARAMS, max_new_tokens=3), seed=1)
    rows = []
    for g in range(3):
        group = started[4 * g : 4 * g + 4]
        partial = [replace(s, stop_reason="interrupted") for s in group[:2]]
        blank = [replace(s, response_ids=[], logprobs=[], versions=[], stop_reason="interrupted") for s in group[2:]]
        rows += [blank[0], partial[0], blank[1], partial[1]]  # identical prefixes not adjacent: index 0, 1, 0, 2
    hooked, handle = prefill_rows(model)
    try:
        (plain, shared), (_, e_shared) = both(model, tok, lambda e: e.resume(rows, PARAMS, seed=3))
    finally:
        handle.remove()
    assert_same(plain, shared)
    assert all(s.response_ids[: len(r.response_ids)] == r.response_ids for s, r in zip(shared, rows))
    assert hooked == [12, 9]  # 6 partial rows (distinct) + 3 distinct blank prompts
    blank_tokens = sum(len(r.prompt.prompt_ids) for r in rows if not r.response_ids)
    assert e_shared.last_prefill.saved_tokens == blank_tokens // 2


def test_rows_beyond_the_slots_wait_and_still_share_their_prefill(model, tok):
    prompts = make_prompts(tok)
    rows, handle = prefill_rows(model)
    try:
        (plain, shared), (_, engine) = both(model, tok, lambda e: e.generate(prompts, PARAMS, seed=5), max_batch_size=6)
    finally:
        handle.remove()
    assert_same(plain, shared)
    # 20 rows on 6 slots: the first prefill takes 6 rows, later ones the rows that waited as slots freed; no prefill
    # is wider than the slots, and rows entering together share (sorted by length, a prompt's rows stay adjacent)
    assert rows[0] == 6 and max(rows) <= 6 and sum(rows) < 2 * 20
    assert engine.last_prefill.rows == 20 and engine.last_prefill.saved_tokens > 0


def test_sliding_window_layers_decode_as_a_full_forward_over_the_window_does(tok):
    """A model with a sliding-window layer (window 4, shorter than the prompts): every sampled token's log-prob is
    the one a plain forward over the whole sequence (no cache, the model's own sliding mask) gives it."""
    model = build_model("micro", tok, seed=0, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    model.eval()
    prompts = make_prompts(tok)[1:3]
    (plain, shared), (_, engine) = both(model, tok, lambda e: e.generate(prompts, PARAMS, seed=2))
    assert_same(plain, shared)
    assert engine.last_prefill.saved_tokens == 3 * sum(len(p.prompt_ids) for p in prompts)
    for s in shared:
        ids = torch.tensor([s.prompt.prompt_ids + s.response_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        n = len(s.prompt.prompt_ids)
        want = [logp[n - 1 + t, tok_id].item() for t, tok_id in enumerate(s.response_ids)]
        torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(want), atol=1e-4, rtol=0)


def test_a_model_with_layers_the_decoder_cannot_slot_is_refused_naming_them(model, tok, monkeypatch):
    from asyncrl.rollout import continuous

    monkeypatch.setattr(continuous, "unsupported_layer_kinds", lambda config: ["LinearAttentionLayer"])
    engine = RolloutEngine(model, tok)
    with pytest.raises(NotImplementedError, match=r"LinearAttentionLayer.*rollout.engine=vllm"):
        engine.generate(make_prompts(tok)[:1], PARAMS, seed=0)
    assert engine.version == 0 and engine.live_rows() == 0
