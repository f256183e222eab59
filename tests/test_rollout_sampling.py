"""Token sampling: top-k/top-p filtering, each row's own seeded draws, and behaviour log-probs taken before
truncation."""

import pytest
import torch

from asyncrl.rollout.sampling import (
    RowStreams,
    SamplingParams,
    filter_top_k,
    filter_top_p,
    row_keys,
    sample_tokens,
    uniform,
)


def _uniforms(n: int, base: int = 0):
    return RowStreams.of(base, [(0, b, 0) for b in range(n)], [0] * n).uniforms(range(n), 0)


def test_top_k_keeps_the_k_largest_logits():
    logits_BV = torch.tensor([[1.0, 4.0, 3.0, 2.0], [0.0, -1.0, 5.0, 6.0]])
    kept_BV = torch.isfinite(filter_top_k(logits_BV, 2))
    assert kept_BV.tolist() == [[False, True, True, False], [False, False, True, True]]
    assert torch.equal(filter_top_k(logits_BV, 0), logits_BV)


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    probs_V = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits_BV = probs_V.log()[None, :]
    assert torch.isfinite(filter_top_p(logits_BV, 0.5)).tolist() == [[True, False, False, False]]
    assert torch.isfinite(filter_top_p(logits_BV, 0.7)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(filter_top_p(logits_BV, 0.81)).tolist() == [[True, True, True, False]]
    assert torch.isfinite(filter_top_p(logits_BV, 0.01)).tolist() == [[True, False, False, False]]  # never empty


def test_greedy_picks_argmax_and_reports_temperature_one_logprob():
    logits_BV = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    tokens_B, logp_B = sample_tokens(logits_BV, SamplingParams(temperature=0.0), None)
    assert tokens_B.tolist() == [1, 0]
    expected_B = torch.log_softmax(logits_BV, -1).gather(-1, tokens_B[:, None]).squeeze(-1)
    torch.testing.assert_close(logp_B, expected_B)


def test_logprob_is_of_the_full_tempered_distribution_not_the_truncated_one():
    logits_BV = torch.tensor([[2.0, 1.0, 0.5, 0.0]])
    params = SamplingParams(temperature=0.5, top_k=1)
    tokens_B, logp_B = sample_tokens(logits_BV, params, _uniforms(1))
    assert tokens_B.tolist() == [0]  # top-k 1 leaves only the argmax
    expected = torch.log_softmax(logits_BV / 0.5, -1)[0, 0]
    torch.testing.assert_close(logp_B[0], expected)
    assert logp_B[0] < -1e-3  # not log(1) of the truncated distribution


def test_sampling_frequencies_follow_the_tempered_distribution():
    logits_V = torch.tensor([1.0, 0.0, -1.0, 0.5])
    logits_BV = logits_V.expand(20000, 4)
    params = SamplingParams(temperature=2.0)
    tokens_B, _ = sample_tokens(logits_BV, params, _uniforms(20000))
    freq_V = torch.bincount(tokens_B, minlength=4).float() / len(tokens_B)
    torch.testing.assert_close(freq_V, torch.softmax(logits_V / 2.0, -1), atol=0.015, rtol=0)


def test_same_seed_gives_same_draws():
    logits_BV = torch.randn(64, 50, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=20)
    a, _ = sample_tokens(logits_BV, params, _uniforms(64, 1))
    b, _ = sample_tokens(logits_BV, params, _uniforms(64, 1))
    c, _ = sample_tokens(logits_BV, params, _uniforms(64, 2))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_a_row_draws_the_same_token_whatever_batch_it_is_in():
    """The row's noise is its own: row 5 of a batch of 64 samples what it samples alone, at any position."""
    logits_BV = torch.randn(64, 50, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.0)
    streams = RowStreams.of(3, [(0, b, b % 4) for b in range(64)], [b % 7 for b in range(64)])
    whole, _ = sample_tokens(logits_BV, params, streams.uniforms(range(64), 2))
    alone, _ = sample_tokens(logits_BV[5:6], params, streams.uniforms([5], 2))
    assert alone.item() == whole[5].item()


def test_tokens_cut_by_top_k_are_never_drawn_even_at_the_ends_of_the_unit_interval():
    logits_BV = torch.tensor([[5.0, 1.0, 0.0, 4.0]]).expand(3, 4)
    tokens_B, _ = sample_tokens(
        logits_BV, SamplingParams(temperature=1.0, top_k=2), torch.tensor([0.0, 0.5, 1 - 2**-53])
    )
    assert set(tokens_B.tolist()) <= {0, 3}


def test_row_keys_differ_for_every_row_and_for_a_prompt_held_twice():
    rows = [(e, i, j) for e in range(2) for i in range(50) for j in range(8)]
    keys = row_keys(7, rows + rows[:3])  # the last three repeat the first three: a prompt held twice
    assert len(set(keys)) == len(keys)
    assert row_keys(7, rows) == keys[: len(rows)]  # a row's key does not depend on what follows it
    draws = [uniform(keys[0], t) for t in range(10000)]
    assert all(0.0 <= u < 1.0 for u in draws) and abs(sum(draws) / len(draws) - 0.5) < 0.02


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n": 0}, "n must be >= 1"),
        ({"temperature": -0.1}, "temperature must be >= 0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"max_new_tokens": 0}, "max_new_tokens must be >= 1"),
    ],
)
def test_invalid_sampling_params_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
