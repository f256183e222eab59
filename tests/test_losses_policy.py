"""PPO-clip policy loss, KL estimators, entropy and log-probs from logits, against values worked out by hand."""

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from asyncrl.losses import entropy_from_logits, kl_penalty, logprobs_from_logits, policy_loss_ppo_clip

# Ratios r = pi / pi_old chosen so each token lands in a known branch (clip 0.2 / 0.2):
#   (0,0) A=+1, r=1.5: -1.5 vs -1*1.2 = -1.2 -> max -1.2, clipped
#   (0,1) A=-1, r=0.5: 0.5 vs 0.8             -> max  0.8, clipped
#   (0,2) A=+2, r=1.0: -2 vs -2               -> -2,        not clipped
#   (1,0) A=-1, r=0.7: 0.7 vs 0.8             -> max  0.8, clipped
#   (1,1) A=+1, r=1.1: -1.1 vs -1.1           -> -1.1,      not clipped
#   (1,2) padding
RATIOS = [[1.5, 0.5, 1.0], [0.7, 1.1, 1.0]]
ADV = torch.tensor([[1.0, -1.0, 2.0], [-1.0, 1.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
OLD_LOGP = torch.full((2, 3), -1.0)


def assert_close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    """Elementwise |actual - expected| <= atol, for nested lists of hand-computed values."""
    torch.testing.assert_close(actual.detach().double(), torch.tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


def _logp(ratios=RATIOS, old=OLD_LOGP):
    return (old + torch.tensor(ratios).log()).clone().requires_grad_(True)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (-1.2 + 0.8 - 2.0 + 0.8 - 1.1) / 5),  # -0.54
        ("seq-mean-token-sum", ((-1.2 + 0.8 - 2.0) + (0.8 - 1.1)) / 2),  # (-2.4 - 0.3) / 2 = -1.35
        ("seq-mean-token-mean", ((-1.2 + 0.8 - 2.0) / 3 + (0.8 - 1.1) / 2) / 2),  # (-0.8 - 0.15) / 2 = -0.475
    ],
)
def test_ppo_clip_loss_by_hand_in_each_agg_mode(mode, expected):
    loss, stats = policy_loss_ppo_clip(_logp(), OLD_LOGP, ADV, MASK, loss_agg_mode=mode)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert float(stats["pg_clipfrac"]) == pytest.approx(3 / 5)
    assert float(stats["pg_clipfrac_lower"]) == 0.0


def test_ppo_kl_stat_is_mean_of_old_minus_new_logp():
    _, stats = policy_loss_ppo_clip(_logp(), OLD_LOGP, ADV, MASK)
    expected = -(math.log(1.5) + math.log(0.5) + math.log(1.0) + math.log(0.7) + math.log(1.1)) / 5
    assert float(stats["ppo_kl"]) == pytest.approx(expected, abs=1e-6)


def test_ppo_clipped_tokens_get_no_gradient():
    logp = _logp()
    loss, _ = policy_loss_ppo_clip(logp, OLD_LOGP, ADV, MASK)
    loss.backward()
    # unclipped token: d(-A r)/dlogp = -A r, over 5 tokens: (0,2) -> -2 * 1 / 5, (1,1) -> -1 * 1.1 / 5
    expected = [[0.0, 0.0, -0.4], [0.0, -0.22, 0.0]]
    assert_close(logp.grad, expected)


def test_ppo_clip_higher_is_asymmetric():
    loss, _ = policy_loss_ppo_clip(_logp(), OLD_LOGP, ADV, MASK, clip_ratio_low=0.2, clip_ratio_high=0.28)
    # only (0,0) changes: A=+1, r=1.5 -> -1 * 1.28
    assert loss.item() == pytest.approx((-1.28 + 0.8 - 2.0 + 0.8 - 1.1) / 5, abs=1e-6)


def test_ppo_dual_clip_caps_negative_advantage_loss():
    old = torch.zeros(1, 3)
    logp = _logp([[4.0, 2.0, 4.0]], old)
    adv = torch.tensor([[-1.0, -1.0, 1.0]])
    mask = torch.ones(1, 3)
    # token 0: A=-1, r=4: max(4, 1.2) = 4, capped at -A*c = 3            -> 3 (dual clip active)
    # token 1: A=-1, r=2: max(2, 1.2) = 2 < 3                              -> 2
    # token 2: A=+1, r=4: max(-4, -1.2) = -1.2, positive A is never capped -> -1.2 (ratio clip active)
    loss, stats = policy_loss_ppo_clip(logp, old, adv, mask, clip_ratio_c=3.0)
    assert loss.item() == pytest.approx((3.0 + 2.0 - 1.2) / 3, abs=1e-6)
    assert float(stats["pg_clipfrac_lower"]) == pytest.approx(1 / 3)
    assert float(stats["pg_clipfrac"]) == pytest.approx(1 / 3)
    loss.backward()
    # the capped token is constant in logp; token 1 has d(-A r)/dlogp = 2 / 3
    assert_close(logp.grad, [[0.0, 2.0 / 3.0, 0.0]])


def test_ppo_dual_clip_requires_c_above_one():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        policy_loss_ppo_clip(_logp(), OLD_LOGP, ADV, MASK, clip_ratio_c=0.9)


def test_ppo_is_weights_scale_per_token_loss_and_get_no_gradient():
    w = torch.tensor([[0.5, 2.0, 1.0], [1.0, 3.0, 100.0]], requires_grad=True)
    loss, _ = policy_loss_ppo_clip(_logp(), OLD_LOGP, ADV, MASK, is_weights_BT=w)
    # (-1.2*0.5 + 0.8*2 - 2*1 + 0.8*1 - 1.1*3) / 5 = (-0.6 + 1.6 - 2 + 0.8 - 3.3) / 5 = -0.7; padding weight unused
    assert loss.item() == pytest.approx(-0.7, abs=1e-6)
    loss.backward()
    assert w.grad is None


def test_ppo_unknown_agg_mode_names_allowed_values():
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-sum, seq-mean-token-mean"):
        policy_loss_ppo_clip(_logp(), OLD_LOGP, ADV, MASK, loss_agg_mode="sum")


LOGP = torch.tensor([[-1.0, -2.0]])
REF = torch.tensor([[-1.5, -1.0]])


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("k1", [0.5, -1.0]),  # logp - ref
        ("kl", [0.5, -1.0]),
        ("k2", [0.125, 0.5]),  # 0.5 * 0.5^2, 0.5 * 1^2
        ("mse", [0.125, 0.5]),
        # d = ref - logp = -0.5, 1: e^d - d - 1
        ("k3", [math.exp(-0.5) + 0.5 - 1.0, math.e - 2.0]),
        ("low_var_kl", [math.exp(-0.5) + 0.5 - 1.0, math.e - 2.0]),
    ],
)
def test_kl_estimators_by_hand(kind, expected):
    assert kl_penalty(LOGP, REF, kind).tolist()[0] == pytest.approx(expected, abs=1e-6)


def test_k3_is_clamped_at_ten_like_verl():
    # ref - logp = 20 -> e^20 - 21 ~ 4.9e8, clamped to 10
    assert kl_penalty(torch.tensor([[-25.0]]), torch.tensor([[-5.0]]), "k3").item() == 10.0


def test_kl_unknown_kind_names_allowed_values():
    with pytest.raises(ValueError, match="k1, kl, k2, mse, k3, low_var_kl"):
        kl_penalty(LOGP, REF, "k4")


def test_kl_gradient_reaches_logp_not_ref():
    logp = LOGP.clone().requires_grad_(True)
    ref = REF.clone().requires_grad_(True)
    kl_penalty(logp, ref, "k1").sum().backward()
    assert logp.grad.tolist() == [[1.0, 1.0]]
    assert ref.grad is None


@settings(derandomize=True, max_examples=60, deadline=None)
@given(
    logp=st.floats(min_value=-30, max_value=0, allow_nan=False),
    ref=st.floats(min_value=-30, max_value=0, allow_nan=False),
)
@example(logp=-5.960464477539063e-08, ref=0.0)  # exp(x) - x - 1 rounds to -6e-8 in float32 here
def test_k3_and_k2_are_nonnegative(logp, ref):
    a, b = torch.tensor([[logp]]), torch.tensor([[ref]])
    assert kl_penalty(a, b, "k3").item() >= 0.0
    assert kl_penalty(a, b, "k2").item() >= 0.0


def test_entropy_of_uniform_is_log_v():
    assert_close(entropy_from_logits(torch.zeros(2, 3, 5)), [[math.log(5)] * 3] * 2)


def test_entropy_two_outcomes_by_hand():
    # p = [1/4, 3/4]
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert entropy_from_logits(logits).item() == pytest.approx(expected, abs=1e-6)


def test_entropy_is_finite_for_extreme_logits():
    h = entropy_from_logits(torch.tensor([[[1000.0, 0.0, -1000.0]]]))
    assert torch.isfinite(h).all()
    assert h.item() == pytest.approx(0.0, abs=1e-6)


def test_logprobs_gather_by_hand():
    # p = [1/8, 2/8, 5/8]; labels pick 5/8 then 1/8
    logits = torch.tensor([[[0.0, math.log(2.0), math.log(5.0)], [0.0, math.log(2.0), math.log(5.0)]]])
    labels = torch.tensor([[2, 0]])
    assert_close(logprobs_from_logits(logits, labels), [[math.log(5 / 8), math.log(1 / 8)]])


def test_logprobs_and_entropy_upcast_bf16_logits():
    logits = torch.tensor([[[0.0, math.log(2.0), math.log(5.0)]]]).to(torch.bfloat16)
    logp = logprobs_from_logits(logits, torch.tensor([[1]]))
    assert logp.dtype == torch.float32
    # bf16 rounds the logits themselves (~3 significant digits); the arithmetic after that is float32
    assert logp.item() == pytest.approx(math.log(2 / 8), abs=1e-2)
    assert entropy_from_logits(logits).dtype == torch.float32


def test_logprobs_gradient_is_onehot_minus_softmax():
    logits = torch.tensor([[[0.0, math.log(3.0)]]], requires_grad=True)
    logprobs_from_logits(logits, torch.tensor([[1]])).sum().backward()
    # d log p_1 / d z = onehot(1) - p = [0 - 1/4, 1 - 3/4]
    assert_close(logits.grad, [[[-0.25, 0.25]]])


def test_ppo_nan_on_padding_does_not_reach_loss_or_gradient():
    old = OLD_LOGP.clone()
    old[1, 2] = float("nan")
    adv = ADV.clone()
    adv[1, 2] = float("nan")
    logp = _logp()
    loss, stats = policy_loss_ppo_clip(logp, old, adv, MASK, clip_ratio_c=3.0)
    loss.backward()
    assert loss.item() == pytest.approx(-0.54, abs=1e-6)
    assert torch.isfinite(logp.grad).all()
    assert all(math.isfinite(float(v)) for v in stats.values())
