"""Identical prefixes are prefilled once: same samples as prefilling every row, fewer rows through the prefill."""

import string
from dataclasses import replace

import pytest
import torch

from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.kv_cache import PreallocatedCache, PreallocatedLayer
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


def test_chunked_rows_share_within_each_chunk(model, tok):
    prompts = make_prompts(tok)
    rows, handle = prefill_rows(model)
    try:
        (plain, shared), (_, engine) = both(model, tok, lambda e: e.generate(prompts, PARAMS, seed=5), max_batch_size=6)
    finally:
        handle.remove()
    assert_same(plain, shared)
    # Sorted by length (stable), a prompt's 4 rows stay adjacent: 6-row chunks hold 2, 2, 2 and 1 distinct prompts.
    assert rows == [6, 6, 6, 2] + [2, 2, 2, 1]
    assert engine.last_prefill.saved_tokens > 0


def test_sliding_window_layers_expand_too(tok):
    model = build_model("micro", tok, seed=0, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    cache = PreallocatedCache(model.config, 8)
    # the full-attention layer is preallocated; the windowed one is transformers' own kind, which expands per row too
    assert type(cache.layers[0]) is PreallocatedLayer and type(cache.layers[1]) is not PreallocatedLayer
    assert cache.can_batch_expand
    prompts = make_prompts(tok)[1:3]
    (plain, shared), (_, engine) = both(model, tok, lambda e: e.generate(prompts, PARAMS, seed=2))
    assert_same(plain, shared)
    assert engine.last_prefill.saved_tokens == 3 * sum(len(p.prompt_ids) for p in prompts)


def test_unsupported_cache_layer_kind_falls_back_to_the_plain_path(model, tok, monkeypatch):
    monkeypatch.setattr(PreallocatedCache, "can_batch_expand", property(lambda self: False))
    (plain, shared), (_, engine) = both(model, tok, lambda e: e.generate(make_prompts(tok)[:2], PARAMS, seed=4))
    assert_same(plain, shared)
    assert engine.last_prefill.saved_tokens == 0
