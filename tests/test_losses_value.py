"""Clipped value loss and explained variance (asyncrl.losses.value), against values worked out by hand."""

import pytest
import torch

from asyncrl.losses import explained_variance, value_loss_clipped

# c = 0.2
#   token 0: v=1.5, old=1.0 -> clip 1.2; R=0: (1.5)^2 = 2.25 vs (1.2)^2 = 1.44 -> 2.25 (clip not binding)
#   token 1: v=2.0, old=1.0 -> clip 1.2; R=3: (1.0)^2 = 1.00 vs (1.8)^2 = 3.24 -> 3.24 (clip binding)
#   token 2: v=0.5, old=0.5 -> clip 0.5; R=1: 0.25 vs 0.25                    -> 0.25
VPREDS = torch.tensor([[1.5, 2.0, 0.5]])
OLD = torch.tensor([[1.0, 1.0, 0.5]])
RETURNS = torch.tensor([[0.0, 3.0, 1.0]])


def assert_close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    """Elementwise |actual - expected| <= atol, for nested lists of hand-computed values."""
    torch.testing.assert_close(actual.detach().double(), torch.tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


def test_clipped_value_loss_by_hand():
    loss, stats = value_loss_clipped(VPREDS, OLD, RETURNS, torch.ones(1, 3), cliprange_value=0.2)
    assert loss.item() == pytest.approx(0.5 * (2.25 + 3.24 + 0.25) / 3, abs=1e-6)
    assert float(stats["vf_clipfrac"]) == pytest.approx(1 / 3)


def test_clipped_value_loss_gradient_stops_on_binding_clip():
    v = VPREDS.clone().requires_grad_(True)
    loss, _ = value_loss_clipped(v, OLD, RETURNS, torch.ones(1, 3), cliprange_value=0.2)
    loss.backward()
    # 0.5 * d(v - R)^2 / dv / 3 tokens = (v - R) / 3: token 0 -> 1.5 / 3, token 1 clipped -> 0, token 2 -> -0.5 / 3
    assert_close(v.grad, [[0.5, 0.0, -0.5 / 3]])


def test_clipped_value_loss_seq_mean_token_sum_ignores_padding():
    mask = torch.tensor([[1, 1, 0]])
    loss, stats = value_loss_clipped(VPREDS, OLD, RETURNS, mask, 0.2, loss_agg_mode="seq-mean-token-sum")
    assert loss.item() == pytest.approx(0.5 * (2.25 + 3.24), abs=1e-6)
    assert float(stats["vf_clipfrac"]) == pytest.approx(1 / 2)


def test_value_loss_unknown_agg_mode_is_rejected():
    with pytest.raises(ValueError, match="loss_agg_mode must be one of"):
        value_loss_clipped(VPREDS, OLD, RETURNS, torch.ones(1, 3), 0.2, loss_agg_mode="mean")


def test_explained_variance_by_hand_ignoring_padding():
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0, 50.0]])
    values = torch.tensor([[1.0, 2.0, 3.0, 3.0, -7.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    # R: mean 2.5, var (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25
    # R - V = [0, 0, 0, 1]: mean 0.25, var (3 * 0.0625 + 0.5625) / 4 = 0.1875
    assert explained_variance(values, returns, mask) == pytest.approx(1 - 0.1875 / 1.25, abs=1e-6)


def test_explained_variance_perfect_and_constant_critic():
    returns = torch.tensor([[1.0, 2.0, 3.0]])
    mask = torch.ones(1, 3)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    # a constant prediction explains nothing
    assert explained_variance(torch.full((1, 3), 7.0), returns, mask) == pytest.approx(0.0, abs=1e-6)


def test_explained_variance_is_zero_when_returns_have_no_spread():
    returns = torch.ones(1, 3)
    assert explained_variance(torch.zeros(1, 3), returns, torch.ones(1, 3)) == 0.0
    assert explained_variance(torch.zeros(1, 3), returns, torch.zeros(1, 3)) == 0.0


def test_value_loss_nan_on_padding_does_not_reach_gradient():
    v = torch.tensor([[1.5, 2.0, 0.5, 0.0]], requires_grad=True)
    old = torch.tensor([[1.0, 1.0, 0.5, float("nan")]])
    ret = torch.tensor([[0.0, 3.0, 1.0, float("nan")]])
    loss, _ = value_loss_clipped(v, old, ret, torch.tensor([[1, 1, 1, 0]]), cliprange_value=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(0.5 * (2.25 + 3.24 + 0.25) / 3, abs=1e-6)
    assert torch.isfinite(v.grad).all()
