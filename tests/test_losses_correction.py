"""Truncated importance sampling (asyncrl.losses.correction), against values worked out by hand."""

import math

import pytest
import torch

from asyncrl.losses import truncated_importance_weights

# Per-token ratios pi_cur / pi_behav (row 1, col 2 is padding, with a garbage log-prob)
RATIOS = [[2.0, 0.5, 4.0], [1.5, 1.0, 1.0]]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
BEHAV = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.0, float("nan")]])
CUR = BEHAV + torch.tensor(RATIOS).log()


def assert_close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    """Elementwise |actual - expected| <= atol, for nested lists of hand-computed values."""
    torch.testing.assert_close(actual.detach().double(), torch.tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


def test_token_level_weights_are_truncated_ratios():
    w, stats = truncated_importance_weights(BEHAV, CUR, MASK, level="token", threshold=2.0)
    # min(r, 2) per token; 0 on padding
    assert_close(w, [[2.0, 0.5, 2.0], [1.5, 1.0, 0.0]])
    # untruncated weights of real tokens: 2, 0.5, 4, 1.5, 1 -> mean 9 / 5, max 4; only the 4 exceeds 2
    assert stats["rollout_corr/is_mean"] == pytest.approx(9 / 5, abs=1e-6)
    assert stats["rollout_corr/is_max"] == pytest.approx(4.0, abs=1e-5)
    assert stats["rollout_corr/truncated_frac"] == pytest.approx(1 / 5)


def test_kl_stats_are_k1_and_k3_of_behav_vs_cur():
    _, stats = truncated_importance_weights(BEHAV, CUR, MASK, level="token", threshold=2.0)
    ratios = [2.0, 0.5, 4.0, 1.5, 1.0]
    # k1 of KL(behav || cur) with samples from behav: mean of log behav - log cur = -log r
    assert stats["rollout_corr/kl"] == pytest.approx(sum(-math.log(r) for r in ratios) / 5, abs=1e-6)
    # k3: r - 1 - log r
    assert stats["rollout_corr/k3_kl"] == pytest.approx(sum(r - 1 - math.log(r) for r in ratios) / 5, abs=1e-6)
    assert all(isinstance(v, float) for v in stats.values())


def test_sequence_level_weight_is_truncated_product_broadcast_to_tokens():
    w, stats = truncated_importance_weights(BEHAV, CUR, MASK, level="sequence", threshold=2.0)
    # row 0: 2 * 0.5 * 4 = 4 -> truncated to 2; row 1: 1.5 * 1 = 1.5
    assert_close(w, [[2.0, 2.0, 2.0], [1.5, 1.5, 0.0]])
    # stats are per response: untruncated 4 and 1.5
    assert stats["rollout_corr/is_mean"] == pytest.approx((4.0 + 1.5) / 2, abs=1e-5)
    assert stats["rollout_corr/is_max"] == pytest.approx(4.0, abs=1e-5)
    assert stats["rollout_corr/truncated_frac"] == pytest.approx(1 / 2)


def test_sequence_level_does_not_overflow_on_long_off_policy_responses():
    behav = torch.zeros(1, 100)
    cur = torch.full((1, 100), 5.0)  # summed log-ratio 500: e^500 overflows float32
    w, stats = truncated_importance_weights(behav, cur, torch.ones(1, 100), level="sequence", threshold=3.0)
    assert torch.all(w == 3.0)
    assert all(math.isfinite(v) for v in stats.values())


def test_weights_are_detached():
    cur = CUR.clone().requires_grad_(True)
    w, _ = truncated_importance_weights(BEHAV, cur, MASK, level="token", threshold=2.0)
    assert not w.requires_grad


def test_all_padding_gives_zero_weights_and_zero_stats():
    w, stats = truncated_importance_weights(BEHAV, CUR, torch.zeros(2, 3), level="sequence", threshold=2.0)
    assert w.abs().sum().item() == 0.0
    assert stats == {k: 0.0 for k in stats}


def test_unknown_level_and_bad_threshold_are_rejected():
    with pytest.raises(ValueError, match="token, sequence"):
        truncated_importance_weights(BEHAV, CUR, MASK, level="geo", threshold=2.0)
    with pytest.raises(ValueError, match="threshold"):
        truncated_importance_weights(BEHAV, CUR, MASK, level="token", threshold=0.0)
