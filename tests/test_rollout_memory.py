"""The built-in engine's memory on the path a GPU cares about: its KV cache is sized to the rows it decodes (not
``max_batch_size`` rows of the longest context), and it samples on the logits' device, the same tokens as the host
did on the CPU."""

from __future__ import annotations

import string

import pytest
import torch

from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.sampling import RowStreams, SamplingParams, sample_rows, sample_tokens
from asyncrl.types import Prompt, Sample


@pytest.fixture(scope="module")
def engine():
    tok = build_char_tokenizer([string.printable[:95]])
    model = build_model("micro", tok, seed=0)
    eos = torch.tensor([tok.eos_token_id])  # rows never end early: every row holds its whole budget
    model.lm_head.register_forward_hook(lambda m, i, out: out.index_add_(-1, eos, torch.full_like(out[..., :1], -1e4)))
    return RolloutEngine(model, tok, max_batch_size=256)


def _cache_bytes(cache) -> int:
    """Bytes of the KV buffers a cache holds: ``numel x element_size`` of every layer's key and value buffers."""
    total = 0
    for layer in cache.layers:
        names = ("keys_buf", "values_buf") if hasattr(layer, "keys_buf") else ("keys", "values")  # slot / prefill
        for name in names:
            t = getattr(layer, name, None)
            if t is not None:
                total += t.numel() * t.element_size()
    return total


def _peak_cache_bytes(engine: RolloutEngine, decode) -> int:
    """The largest KV cache any forward of ``decode()`` ran with (seen after each forward, when it is filled)."""
    peak = [0]

    def seen(module, args, kwargs, output):
        cache = kwargs.get("past_key_values")
        if cache is not None:
            peak[0] = max(peak[0], _cache_bytes(cache))

    handle = engine.model.register_forward_hook(seen, with_kwargs=True)
    try:
        decode()
    finally:
        handle.remove()
    return peak[0]


def _prompts(rows: int, length: int) -> list[Prompt]:
    g = torch.Generator().manual_seed(rows * 1000 + length)
    ids = torch.randint(3, 60, (rows, length), generator=g).tolist()
    return [Prompt(index=i, prompt_ids=p, data_source="test", ground_truth="") for i, p in enumerate(ids)]


def _kv_bytes_per_token_row(engine: RolloutEngine) -> int:
    c = engine.model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * 4  # keys and values, float32


def test_a_calls_kv_cache_holds_its_rows_times_their_length_not_max_batch_size(engine):
    per = _kv_bytes_per_token_row(engine)
    for rows, length, new in [(4, 100, 8), (8, 50, 8), (2, 20, 30)]:
        params = SamplingParams(n=1, temperature=1.0, max_new_tokens=new)
        prompts = _prompts(rows, length)
        fresh = RolloutEngine(engine.model, engine.tokenizer, max_batch_size=256)  # its buffers kept between calls
        peak = _peak_cache_bytes(fresh, lambda p=prompts, s=params, e=fresh: e.generate(p, s, seed=0))
        need = length + new  # the slot cache keeps room for half as much again (at least 16) before it must move
        assert rows * need * per <= peak <= rows * (need + max(need // 2, 16)) * per, (rows, length, new)
    assert engine.max_batch_size == 256  # the call's rows were allocated, not 256


def test_the_streaming_decoders_kv_cache_grows_with_the_rows_it_holds_not_its_capacity(engine):
    per = _kv_bytes_per_token_row(engine)
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=8)
    blank = [Sample.blank(p, 0, 0) for p in _prompts(4, 100)]

    def stream():
        engine.submit(blank, params, seed=0)
        engine.drain()

    peak = _peak_cache_bytes(engine, stream)
    need = 100 + 8  # prompt + budget; the slot cache keeps room for half as much again before it must move
    assert 4 * need * per <= peak <= 4 * (need + need // 2) * per  # 4 slots of 256


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=0.9, top_p=0.8, top_k=5),
    ],
)
def test_sampling_runs_on_the_logits_device_and_draws_what_the_host_drew(params):
    streams = RowStreams.of(7, [(0, i, 0) for i in range(4)], [0, 3, 0, 1])
    uniforms = None if params.greedy else streams.uniforms(range(4), 2)
    logits = torch.randn(4, 97, generator=torch.Generator().manual_seed(0)) * 3
    on_meta = sample_rows(logits.to("meta"), params, uniforms)  # any read on the host would raise on meta
    assert all(t.device.type == "meta" and t.shape == (4,) for t in on_meta)
    tokens, logp = sample_rows(logits, params, uniforms)
    host_tokens, host_logp = sample_tokens(logits.cpu().clone(), params, uniforms)  # the host path of before
    assert torch.equal(tokens, host_tokens) and torch.equal(logp, host_logp)
