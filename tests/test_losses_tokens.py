"""Masked reductions and loss aggregation (asyncrl.losses.tokens). Expected values are worked out by hand below."""

import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.losses import agg_loss, masked_mean, masked_sum, masked_var, zero_padding


def assert_close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    """Elementwise |actual - expected| <= atol, for nested lists of hand-computed values."""
    torch.testing.assert_close(actual.detach().double(), torch.tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


def test_masked_mean_ignores_nan_on_padding():
    x = torch.tensor([[1.0, 2.0, float("nan")]])
    mask = torch.tensor([[1, 1, 0]])
    # (1 + 2) / 2
    assert masked_mean(x, mask).item() == pytest.approx(1.5)
    assert masked_sum(x, mask).item() == pytest.approx(3.0)


def test_masked_mean_all_zero_mask_is_zero_not_nan():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    out = masked_mean(x, torch.zeros(2, 2))
    assert out.item() == 0.0
    out.backward()
    assert torch.isfinite(x.grad).all()


def test_masked_mean_along_dim_gives_zero_for_empty_rows():
    x = torch.tensor([[1.0, 2.0, 9.0], [5.0, 6.0, 7.0]])
    mask = torch.tensor([[True, True, False], [False, False, False]])
    # row 0: (1 + 2) / 2 = 1.5; row 1: no token -> 0
    assert masked_mean(x, mask, dim=-1).tolist() == pytest.approx([1.5, 0.0])


def test_masked_mean_float_mask_acts_as_weights():
    x = torch.tensor([2.0, 4.0])
    w = torch.tensor([0.5, 1.0])
    # (0.5 * 2 + 1 * 4) / 1.5 = 5 / 1.5
    assert masked_mean(x, w).item() == pytest.approx(5.0 / 1.5)


def test_masked_var_unbiased_and_biased_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # mean 2; squared deviations 1, 0, 1 -> sum 2; unbiased 2 / (3 - 1) = 1, biased 2 / 3
    assert masked_var(x, mask).item() == pytest.approx(1.0)
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(2.0 / 3.0)


def test_masked_var_of_one_token_or_none_is_zero():
    x = torch.tensor([[5.0, 7.0]])
    assert masked_var(x, torch.tensor([[1, 0]])).item() == 0.0
    assert masked_var(x, torch.tensor([[0, 0]])).item() == 0.0


LOSS_2x3 = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK_2x3 = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_agg_loss_token_mean_by_hand():
    # tokens 1, 2, 4 -> 7 / 3
    assert agg_loss(LOSS_2x3, MASK_2x3, "token-mean").item() == pytest.approx(7.0 / 3.0)


def test_agg_loss_seq_mean_token_sum_by_hand():
    # per-seq sums 1 + 2 = 3 and 4 -> mean 3.5
    assert agg_loss(LOSS_2x3, MASK_2x3, "seq-mean-token-sum").item() == pytest.approx(3.5)


def test_agg_loss_seq_mean_token_mean_by_hand():
    # per-seq means 1.5 and 4 -> mean 2.75
    assert agg_loss(LOSS_2x3, MASK_2x3, "seq-mean-token-mean").item() == pytest.approx(2.75)


def test_agg_loss_excludes_empty_sequences_from_seq_means():
    loss = torch.tensor([[1.0, 2.0], [7.0, float("nan")]], requires_grad=True)
    mask = torch.tensor([[1, 1], [0, 0]])
    # only row 0 counts: mean 1.5, sum 3
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(1.5)
    assert agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx(3.0)
    agg_loss(loss, mask, "seq-mean-token-mean").backward()
    # d/d loss[0, t] = (1 / 2 tokens) * (1 / 1 sequence); the empty row gets no gradient
    assert_close(loss.grad, [[0.5, 0.5], [0.0, 0.0]])


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_agg_loss_all_empty_batch_is_zero_with_finite_grad(mode):
    loss = torch.ones(2, 3, requires_grad=True)
    out = agg_loss(loss, torch.zeros(2, 3), mode)
    assert out.item() == 0.0
    out.backward()
    assert torch.isfinite(loss.grad).all()


def test_agg_loss_unknown_mode_names_allowed_values():
    with pytest.raises(ValueError) as err:
        agg_loss(LOSS_2x3, MASK_2x3, "x")
    msg = str(err.value)
    assert "token-mean, seq-mean-token-sum, seq-mean-token-mean" in msg
    assert "'x'" in msg


@settings(derandomize=True, max_examples=40, deadline=None)
@given(
    c=st.floats(min_value=-100, max_value=100, allow_nan=False),
    bits=st.lists(st.booleans(), min_size=6, max_size=6).filter(any),
)
def test_agg_loss_of_a_constant_is_that_constant_in_every_mean_mode(c, bits):
    mask = torch.tensor(bits).reshape(2, 3)
    loss = torch.full((2, 3), c, dtype=torch.float64)
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(c, abs=1e-9)
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(c, abs=1e-9)


@settings(derandomize=True, max_examples=40, deadline=None)
@given(n=st.integers(min_value=2, max_value=8), seed=st.integers(min_value=0, max_value=2**16))
def test_masked_var_with_full_mask_matches_statistics_module(n, seed):
    values = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    expected = statistics.variance(values.tolist())
    assert masked_var(values, torch.ones(n)).item() == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert math.isfinite(masked_var(values, torch.ones(n), unbiased=False).item())


def test_masked_mean_of_bf16_counts_tokens_exactly():
    # 1000 ones and one 1000 (all exact in bf16): mean (1000 + 1000) / 1001 ~ 1.998. In bf16 the count 1001 itself
    # would round to 1000 (8 significant bits) and the mean would come out as 2.0.
    x = torch.ones(1, 1001, dtype=torch.bfloat16)
    x[0, -1] = 1000.0
    out = masked_mean(x, torch.ones(1, 1001, dtype=torch.bool))
    assert out.dtype == torch.float32
    assert out.item() == pytest.approx(2000 / 1001, rel=1e-6)


def test_zero_padding_replaces_padding_even_nan():
    x = torch.tensor([[1.0, float("nan")], [float("inf"), 4.0]])
    assert_close(zero_padding(x, torch.tensor([[1, 0], [0, 1]])), [[1.0, 0.0], [0.0, 4.0]])
