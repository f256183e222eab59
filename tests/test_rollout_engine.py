"""RolloutEngine.generate: agreement with HF generate, log-probs, seeding, stopping, ordering and chunking."""

import string

import pytest
import torch

from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Prompt

TEXTS = ["a", "hello world", "What is 2+2? Think step by step.", "xy", "The quick brown fox"]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=16)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer([string.printable[:95]])


@pytest.fixture
def model(tok):
    # A wide init makes a random model's greedy continuations vary with the context instead of repeating one token.
    return build_model("micro", tok, seed=0, initializer_range=0.3)


def make_prompts(tok, texts=TEXTS):
    return [Prompt(index=i, prompt_ids=tok.encode(t), data_source="test", ground_truth="") for i, t in enumerate(texts)]


def bias_logit(model, token_id, amount):
    """Add ``amount`` to one token's logit in every forward (engine and HF generate alike)."""

    def hook(module, inputs, output):
        output[..., token_id] += amount
        return output

    return model.lm_head.register_forward_hook(hook)


def hf_greedy(model, tok, texts, max_new_tokens):
    """Reference: HF generate on left-padded prompts, each row cut after its first eos."""
    rows = [tok.encode(t) for t in texts]
    width = max(len(r) for r in rows)
    ids_BL = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows])
    mask_BL = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    model.eval()
    with torch.no_grad():
        out_BT = model.generate(
            input_ids=ids_BL,
            attention_mask=mask_BL,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )[:, width:]
    result = []
    for row in out_BT.tolist():
        result.append(row[: row.index(tok.eos_token_id) + 1] if tok.eos_token_id in row else row)
    return result


def test_greedy_matches_hf_generate_for_prompts_of_different_lengths(model, tok):
    samples = RolloutEngine(model, tok).generate(make_prompts(tok), GREEDY)
    expected = hf_greedy(model, tok, TEXTS, GREEDY.max_new_tokens)
    assert [s.response_ids for s in samples] == expected
    assert len({tuple(r) for r in expected}) == len(TEXTS)  # the comparison is not between constant outputs


def test_greedy_matches_hf_generate_when_rows_stop_at_different_times(model, tok):
    bias_logit(model, tok.eos_token_id, 4.0)
    texts = TEXTS * 4
    samples = RolloutEngine(model, tok).generate(make_prompts(tok, texts), SamplingParams(temperature=0.0))
    assert [s.response_ids for s in samples] == hf_greedy(model, tok, texts, 64)
    eos_lengths = {len(s.response_ids) for s in samples if s.stop_reason == "eos"}
    assert len(eos_lengths) >= 3  # rows finish at several different steps (finished rows get dropped mid-way)
    for s in samples:
        assert (s.response_ids[-1] == tok.eos_token_id) == (s.stop_reason == "eos")


def test_logprobs_equal_a_full_forward_pass_of_the_tempered_distribution(model, tok):
    params = SamplingParams(n=2, temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=12)
    samples = RolloutEngine(model, tok).generate(make_prompts(tok), params, seed=0)
    model.eval()
    with torch.no_grad():
        for s in samples:
            ids_T = torch.tensor(s.prompt.prompt_ids + s.response_ids)
            logits_TV = model(ids_T[None]).logits[0] / params.temperature
            P = len(s.prompt.prompt_ids)
            logp_R = torch.log_softmax(logits_TV[P - 1 : -1], -1).gather(-1, ids_T[P:, None]).squeeze(-1)
            torch.testing.assert_close(torch.tensor(s.logprobs), logp_R, atol=1e-4, rtol=0)


def test_samples_are_prompt_major_with_n_per_prompt_and_full_bookkeeping(model, tok):
    engine = RolloutEngine(model, tok, version=5)
    samples = engine.generate(make_prompts(tok), SamplingParams(n=3, max_new_tokens=8), seed=1)
    assert [s.prompt.index for s in samples] == [i for i in range(len(TEXTS)) for _ in range(3)]
    for s in samples:
        assert len(s.logprobs) == len(s.versions) == len(s.response_ids) >= 1
        assert s.versions == [5] * len(s.response_ids) and s.start_version == 5
        assert s.stop_reason in ("eos", "length")
        assert s.response_text == tok.decode(s.response_ids, skip_special_tokens=True)


def test_same_seed_gives_identical_samples_and_another_seed_differs(model, tok):
    engine = RolloutEngine(model, tok)
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=10)
    a = engine.generate(make_prompts(tok), params, seed=11)
    b = engine.generate(make_prompts(tok), params, seed=11)
    c = engine.generate(make_prompts(tok), params, seed=12)
    assert [(s.response_ids, s.logprobs) for s in a] == [(s.response_ids, s.logprobs) for s in b]
    assert [s.response_ids for s in a] != [s.response_ids for s in c]


def test_top_k_one_samples_the_greedy_tokens(model, tok):
    engine = RolloutEngine(model, tok)
    greedy = engine.generate(make_prompts(tok), GREEDY)
    top1 = engine.generate(make_prompts(tok), SamplingParams(temperature=1.3, top_k=1, max_new_tokens=16), seed=3)
    assert [s.response_ids for s in top1] == [s.response_ids for s in greedy]


def test_forced_eos_stops_each_row_with_eos_as_its_trained_last_token(model, tok):
    bias_logit(model, tok.eos_token_id, 1e4)
    samples = RolloutEngine(model, tok).generate(make_prompts(tok), SamplingParams(max_new_tokens=8), seed=0)
    for s in samples:
        assert s.stop_reason == "eos" and s.response_ids == [tok.eos_token_id]
        assert s.logprobs[0] == pytest.approx(0.0, abs=1e-4)
        assert s.response_text == ""


def test_rows_that_never_emit_eos_stop_at_max_new_tokens(model, tok):
    bias_logit(model, tok.eos_token_id, -1e4)
    samples = RolloutEngine(model, tok).generate(make_prompts(tok), SamplingParams(max_new_tokens=7), seed=0)
    assert all(s.stop_reason == "length" and len(s.response_ids) == 7 for s in samples)


def test_extra_eos_ids_also_stop_generation(model, tok):
    stop_id = tok.convert_tokens_to_ids("!")
    bias_logit(model, stop_id, 1e4)
    engine = RolloutEngine(model, tok, eos_token_ids=[tok.eos_token_id, stop_id])
    samples = engine.generate(make_prompts(tok), SamplingParams(max_new_tokens=8), seed=0)
    assert all(s.stop_reason == "eos" and s.response_ids == [stop_id] for s in samples)


def test_chunking_by_max_batch_size_keeps_greedy_outputs_and_order(model, tok):
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=12)
    whole = RolloutEngine(model, tok).generate(make_prompts(tok), params)
    chunked = RolloutEngine(model, tok, max_batch_size=3).generate(make_prompts(tok), params)
    assert [(s.prompt.index, s.response_ids) for s in chunked] == [(s.prompt.index, s.response_ids) for s in whole]
    for a, b in zip(whole, chunked):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


def test_generate_restores_the_model_train_mode(model, tok):
    model.train()
    RolloutEngine(model, tok).generate(make_prompts(tok)[:1], SamplingParams(max_new_tokens=2), seed=0)
    assert model.training


def test_empty_prompt_is_rejected_by_index(model, tok):
    prompts = [Prompt(index=42, prompt_ids=[], data_source="test", ground_truth="")]
    with pytest.raises(ValueError, match="prompt index 42 has no tokens"):
        RolloutEngine(model, tok).generate(prompts, GREEDY)
