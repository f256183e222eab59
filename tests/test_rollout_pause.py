"""Pause and resume: interrupted samples keep their tokens and finish later with the then-current weights."""

import string
import threading
import time

import pytest
import torch

from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Prompt, Sample

TEXTS = ["a", "hello world", "What is 2+2?", "xy"]
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer([string.printable[:95]])


@pytest.fixture
def model(tok):
    model = build_model("micro", tok, seed=0, initializer_range=0.3)
    model.lm_head.register_forward_hook(lambda m, i, out: out.index_fill_(-1, torch.tensor([tok.eos_token_id]), -1e4))
    return model  # eos is never sampled here, so every uninterrupted row runs to NEW_TOKENS


def make_prompts(tok):
    return [Prompt(index=i, prompt_ids=tok.encode(t), data_source="test", ground_truth="") for i, t in enumerate(TEXTS)]


def pause_after_tokens(engine, model, count):
    """Request a pause from inside the forward that follows a row's ``count``-th token (the prefill is the 1st
    forward): the call returns at the end of that decode step, ``count`` tokens a row."""
    calls = [0]

    def hook(module, inputs, output):
        calls[0] += 1
        if calls[0] == count + 1:
            engine.request_pause()

    return model.register_forward_hook(hook)


def perturbed_weights(engine, seed):
    gen = torch.Generator().manual_seed(seed)
    return {name: t + 0.1 * torch.randn(t.shape, generator=gen) for name, t in engine.state_dict_for_sync().items()}


def recomputed_logprobs(model, sample, temperature):
    ids_T = torch.tensor(sample.prompt.prompt_ids + sample.response_ids)
    with torch.no_grad():
        logits_TV = model(ids_T[None]).logits[0] / temperature
    P = len(sample.prompt.prompt_ids)
    return torch.log_softmax(logits_TV[P - 1 : -1], -1).gather(-1, ids_T[P:, None]).squeeze(-1)


def test_pause_mid_generation_returns_interrupted_samples_with_tokens_so_far(model, tok):
    engine = RolloutEngine(model, tok)
    pause_after_tokens(engine, model, 3)
    samples = engine.generate(make_prompts(tok), SamplingParams(n=2, max_new_tokens=NEW_TOKENS), seed=0)
    assert len(samples) == 2 * len(TEXTS)
    for s in samples:
        assert s.stop_reason == "interrupted" and not s.finished
        assert len(s.response_ids) == len(s.logprobs) == len(s.versions) == 3


def test_pause_requested_before_generate_returns_empty_interrupted_samples(model, tok):
    engine = RolloutEngine(model, tok)
    engine.request_pause()
    samples = engine.generate(make_prompts(tok), SamplingParams(max_new_tokens=NEW_TOKENS), seed=0)
    assert all(s.stop_reason == "interrupted" and s.response_ids == [] for s in samples)
    engine.clear_pause()
    resumed = engine.resume(samples, SamplingParams(max_new_tokens=NEW_TOKENS), seed=0)
    assert all(s.stop_reason == "length" and len(s.response_ids) == NEW_TOKENS for s in resumed)


def test_resume_after_weight_update_tags_continued_tokens_with_the_new_version(model, tok):
    params = SamplingParams(temperature=0.8, max_new_tokens=NEW_TOKENS)
    engine = RolloutEngine(model, tok, version=3)
    handle = pause_after_tokens(engine, model, 4)
    interrupted = engine.generate(make_prompts(tok), params, seed=0)
    handle.remove()
    old_logprobs = [recomputed_logprobs(model, s, params.temperature) for s in interrupted]

    engine.update_weights(perturbed_weights(engine, seed=1), version=4)
    engine.clear_pause()
    resumed = engine.resume(interrupted, params, seed=1)

    for before, after, old_logp in zip(interrupted, resumed, old_logprobs):
        assert after.stop_reason == "length" and len(after.response_ids) == NEW_TOKENS
        assert after.response_ids[:4] == before.response_ids and after.prompt is before.prompt
        assert after.versions == [3] * 4 + [4] * (NEW_TOKENS - 4)
        assert after.start_version == 3
        torch.testing.assert_close(torch.tensor(after.logprobs[:4]), old_logp, atol=1e-4, rtol=0)
        new_logp = recomputed_logprobs(model, after, params.temperature)[4:]
        torch.testing.assert_close(torch.tensor(after.logprobs[4:]), new_logp, atol=1e-4, rtol=0)
        assert after.response_text == tok.decode(after.response_ids, skip_special_tokens=True)


def test_greedy_resume_reproduces_the_uninterrupted_greedy_response(model, tok):
    params = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS)
    engine = RolloutEngine(model, tok)
    uninterrupted = engine.generate(make_prompts(tok), params)
    handle = pause_after_tokens(engine, model, 2)
    interrupted = engine.generate(make_prompts(tok), params)
    handle.remove()
    engine.clear_pause()
    resumed = engine.resume(interrupted, params)
    assert [len(s.response_ids) for s in interrupted] == [2] * len(TEXTS)
    assert [s.response_ids for s in resumed] == [s.response_ids for s in uninterrupted]


def test_pause_from_another_thread_interrupts_a_running_generate(model, tok):
    engine = RolloutEngine(model, tok)
    started = threading.Event()

    def hook(module, inputs, output):
        started.set()
        deadline = time.monotonic() + 10
        while not engine.pause_requested:  # hold this decode step until the other thread has paused
            assert time.monotonic() < deadline, "the pausing thread never called request_pause"
            time.sleep(0.001)

    model.register_forward_hook(hook)
    pauser = threading.Thread(target=lambda: started.wait(timeout=10) and engine.request_pause())
    pauser.start()
    samples = engine.generate(make_prompts(tok), SamplingParams(max_new_tokens=NEW_TOKENS), seed=0)
    pauser.join(timeout=10)
    assert all(s.stop_reason == "interrupted" and len(s.response_ids) == 1 for s in samples)


def test_resume_leaves_finished_samples_alone_and_closes_full_ones_as_length(model, tok):
    engine = RolloutEngine(model, tok)
    finished = engine.generate(make_prompts(tok)[:1], SamplingParams(max_new_tokens=3), seed=0)[0]
    full = engine.generate(make_prompts(tok)[1:2], SamplingParams(max_new_tokens=3), seed=0)[0]
    full.stop_reason = "interrupted"
    out = engine.resume([finished, full], SamplingParams(max_new_tokens=3), seed=0)
    assert out[0] is finished
    assert out[1].stop_reason == "length" and out[1].response_ids == full.response_ids


def test_refill_cuts_a_decode_short_and_greedy_continuation_is_unchanged(tok, model):
    """``refill`` interrupts between decode steps; resuming the
    interrupted rows with the same weights gives exactly the uninterrupted greedy output."""
    engine = RolloutEngine(model, tok)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=NEW_TOKENS)
    prompts = make_prompts(tok)
    straight = engine.generate(prompts, greedy, seed=0)
    polls: list[int] = []

    def refill(n_active: int) -> bool:
        polls.append(n_active)
        return len(polls) == 3  # after the 3rd decode step

    blank = [Sample.blank(p, 0, 0) for p in prompts]
    cut = engine.resume(blank, greedy, seed=0, refill=refill)
    assert all(s.stop_reason == "interrupted" and len(s.response_ids) == 3 for s in cut)
    assert polls == [len(prompts)] * 3  # polled with the number of running rows
    done = engine.resume(cut, greedy, seed=0)
    assert [s.response_ids for s in done] == [s.response_ids for s in straight]
    for a, b in zip(done, straight):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
