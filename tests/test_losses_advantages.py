"""GRPO advantages, GAE and whitening (asyncrl.losses.advantages), against values worked out by hand."""

import math

import pytest
import torch

from asyncrl.losses import (
    broadcast_advantages,
    compute_gae,
    compute_grpo_advantages,
    group_reward_spread,
    whiten,
)


def assert_close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    """Elementwise |actual - expected| <= atol, for nested lists of hand-computed values."""
    torch.testing.assert_close(actual.detach().double(), torch.tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


def test_grpo_normalises_by_unbiased_group_std():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 0])
    # mean 0.5; squared deviations 4 * 0.25 = 1; unbiased var 1 / 3 -> std sqrt(1/3) ~ 0.5774 (biased would be 0.5)
    a = 0.5 / (math.sqrt(1.0 / 3.0) + 1e-6)
    assert compute_grpo_advantages(rewards, groups).tolist() == pytest.approx([a, -a, a, -a], rel=1e-6)


def test_grpo_without_std_normalisation_is_mean_centred_reward():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    groups = torch.zeros(4, dtype=torch.long)
    assert compute_grpo_advantages(rewards, groups, norm_by_std=False).tolist() == pytest.approx([0.5, -0.5, 0.5, -0.5])


def test_grpo_group_of_one_gets_zero():
    rewards = torch.tensor([1.0, 0.0, 5.0])
    groups = torch.tensor([0, 0, 1])
    adv = compute_grpo_advantages(rewards, groups)
    assert adv[2].item() == 0.0
    # the pair: mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1) = sqrt(0.5)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert adv[:2].tolist() == pytest.approx([a, -a], rel=1e-6)
    assert compute_grpo_advantages(rewards, groups, norm_by_std=False)[2].item() == 0.0


def test_grpo_all_equal_group_gets_zero_not_nan():
    adv = compute_grpo_advantages(torch.tensor([3.0, 3.0, 3.0]), torch.tensor([7, 7, 7]))
    assert adv.tolist() == [0.0, 0.0, 0.0]


def test_grpo_groups_need_not_be_contiguous():
    rewards = torch.tensor([1.0, 2.0, 0.0, 4.0])
    groups = torch.tensor([3, 1, 3, 1])
    # group 3 = [1, 0]: mean 0.5, std sqrt(0.5); group 1 = [2, 4]: mean 3, std sqrt((1 + 1) / 1) = sqrt(2)
    a3 = 0.5 / (math.sqrt(0.5) + 1e-6)
    a1 = 1.0 / (math.sqrt(2.0) + 1e-6)
    assert compute_grpo_advantages(rewards, groups).tolist() == pytest.approx([a3, -a1, -a3, a1], rel=1e-6)


def test_grpo_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="rewards_B and group_ids_B"):
        compute_grpo_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long))


def test_broadcast_advantages_is_zero_on_padding():
    adv = broadcast_advantages(torch.tensor([2.0, -1.0]), torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert adv.tolist() == [[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]


def test_group_reward_spread_counts_groups_with_different_rewards():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 2])
    # group 0 differs, group 1 all equal, group 2 has one member -> 1 of 3
    assert group_reward_spread(rewards, groups) == pytest.approx(1.0 / 3.0)
    assert isinstance(group_reward_spread(rewards, groups), float)


def test_gae_hand_example_gamma_09_lambda_08():
    gamma, lam = 0.9, 0.8
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    mask = torch.ones(1, 3)
    # t=2: delta = 1 + 0.9*0 - 0.7 = 0.3                 A2 = 0.3
    # t=1: delta = 0 + 0.9*0.7 - 0.6 = 0.03              A1 = 0.03 + 0.72*0.3 = 0.246
    # t=0: delta = 0 + 0.9*0.6 - 0.5 = 0.04              A0 = 0.04 + 0.72*0.246 = 0.21712
    adv, ret = compute_gae(rewards, values, mask, gamma, lam)
    assert_close(adv, [[0.21712, 0.246, 0.3]])
    # returns = A + V
    assert_close(ret, [[0.71712, 0.846, 1.0]])


def test_gae_bootstraps_zero_after_last_real_token_and_ignores_padded_values():
    rewards = torch.tensor([[0.0, 1.0, 5.0]])  # the 5 sits on padding and must be ignored
    values = torch.tensor([[0.5, 0.6, float("nan")]])
    mask = torch.tensor([[1, 1, 0]])
    # t=1: delta = 1 + 0.9*0 - 0.6 = 0.4              A1 = 0.4
    # t=0: delta = 0 + 0.9*0.6 - 0.5 = 0.04           A0 = 0.04 + 0.72*0.4 = 0.328
    adv, ret = compute_gae(rewards, values, mask, 0.9, 0.8)
    assert_close(adv, [[0.328, 0.4, 0.0]])
    assert_close(ret, [[0.828, 1.0, 0.0]])


def test_gae_with_gamma_and_lambda_one_is_reward_to_go_minus_value():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    adv, ret = compute_gae(rewards, values, torch.ones(1, 3), 1.0, 1.0)
    # reward-to-go is 1 everywhere
    assert_close(adv, [[0.5, 0.4, 0.3]])
    assert_close(ret, [[1.0, 1.0, 1.0]])


def test_gae_outputs_carry_no_grad():
    values = torch.tensor([[0.5, 0.6]], requires_grad=True)
    adv, ret = compute_gae(torch.tensor([[0.0, 1.0]]), values, torch.ones(1, 2), 0.9, 0.8)
    assert not adv.requires_grad and not ret.requires_grad


def test_whiten_by_hand_with_padding():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # mean 2, unbiased var (1 + 0 + 1) / 2 = 1 -> (x - 2) / 1; padding -> 0
    assert_close(whiten(x, mask), [[-1.0, 0.0, 1.0, 0.0]])
    # shift_mean=False adds the mean back: only the scale changes (here it is 1)
    assert_close(whiten(x, mask, shift_mean=False), [[1.0, 2.0, 3.0, 0.0]])


def test_whiten_rescales_to_unit_variance():
    x = torch.tensor([[0.0, 4.0], [8.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    # values 0, 4, 8: mean 4, unbiased var (16 + 0 + 16) / 2 = 16 -> std 4
    assert_close(whiten(x, mask), [[-1.0, 0.0], [1.0, 0.0]])
