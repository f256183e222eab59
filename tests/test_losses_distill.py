"""On-policy distillation losses (asyncrl.losses.distill_loss), on a tiny vocabulary worked out by hand.

Fixture (V = 4, K = 2), position 0:
  student q = [0.4, 0.3, 0.2, 0.1]; teacher top-2 ids [1, 0] with p = [0.5, 0.3] -> teacher tail 0.2
  bucket distributions over (id 1, id 0, rest): p = [0.5, 0.3, 0.2], q = [0.3, 0.4, 0.3]
Position 1:
  student uniform q = 0.25 each; teacher top-2 ids [2, 3] with p = [0.6, 0.4] -> teacher tail 0
  bucket: p = [0.6, 0.4, 0], q = [0.25, 0.25, 0.5]
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.losses import generalized_jsd_topk, mix_on_policy, reverse_kl_sampled, topk_forward_kl

STUDENT_Q = [[[0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]]]
TEACHER_IDS = torch.tensor([[[1, 0], [2, 3]]])
TEACHER_P = [[[0.5, 0.3], [0.6, 0.4]]]
MASK = torch.ones(1, 2)

# forward KL(p || q) on the bucketed support
FWD_BUCKET_0 = 0.5 * math.log(0.5 / 0.3) + 0.3 * math.log(0.3 / 0.4) + 0.2 * math.log(0.2 / 0.3)
FWD_BUCKET_1 = 0.6 * math.log(0.6 / 0.25) + 0.4 * math.log(0.4 / 0.25)  # teacher tail mass 0 adds nothing
# renorm: p~ = [0.5, 0.3] / 0.8, q~ = [0.3, 0.4] / 0.7 (position 0); p~ = [0.6, 0.4], q~ = [0.5, 0.5] (position 1)
FWD_RENORM_0 = 0.625 * math.log(0.625 / (3 / 7)) + 0.375 * math.log(0.375 / (4 / 7))
FWD_RENORM_1 = 0.6 * math.log(0.6 / 0.5) + 0.4 * math.log(0.4 / 0.5)


def assert_close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    """Elementwise |actual - expected| <= atol, for nested lists of hand-computed values."""
    torch.testing.assert_close(actual.detach().double(), torch.tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


def _student(requires_grad=False, dtype=torch.float32):
    return torch.tensor(STUDENT_Q, dtype=dtype).log().requires_grad_(requires_grad)


def _teacher_logp(dtype=torch.float32):
    return torch.tensor(TEACHER_P, dtype=dtype).log()


def test_topk_forward_kl_bucket_by_hand():
    loss, kl = topk_forward_kl(_student(), TEACHER_IDS, _teacher_logp(), MASK, tail="bucket")
    assert_close(kl, [[FWD_BUCKET_0, FWD_BUCKET_1]])
    assert loss.item() == pytest.approx((FWD_BUCKET_0 + FWD_BUCKET_1) / 2, abs=1e-6)


def test_topk_forward_kl_renorm_by_hand():
    loss, kl = topk_forward_kl(_student(), TEACHER_IDS, _teacher_logp(), MASK, tail="renorm")
    assert_close(kl, [[FWD_RENORM_0, FWD_RENORM_1]])
    assert loss.item() == pytest.approx((FWD_RENORM_0 + FWD_RENORM_1) / 2, abs=1e-6)


def test_topk_forward_kl_masks_padding_positions():
    loss, kl = topk_forward_kl(_student(), TEACHER_IDS, _teacher_logp(), torch.tensor([[1, 0]]))
    assert kl[0, 1].item() == 0.0
    assert loss.item() == pytest.approx(FWD_BUCKET_0, abs=1e-6)


@pytest.mark.parametrize("pad_value", [float("nan"), float("-inf")])
def test_garbage_teacher_on_padding_does_not_reach_loss_or_gradient(pad_value):
    student = _student(requires_grad=True)
    teacher = _teacher_logp()
    teacher[0, 1] = pad_value  # position 1 is padding
    mask = torch.tensor([[1, 0]])
    for tail in ("bucket", "renorm"):
        loss, _ = topk_forward_kl(student, TEACHER_IDS, teacher, mask, tail=tail)
        jsd_loss, _ = generalized_jsd_topk(student, TEACHER_IDS, teacher, mask, beta=0.5, tail=tail)
        (loss + jsd_loss).backward()
        assert torch.isfinite(student.grad).all()
        assert student.grad[0, 1].abs().sum().item() == 0.0
        student.grad = None
    assert topk_forward_kl(student, TEACHER_IDS, teacher, mask)[0].item() == pytest.approx(FWD_BUCKET_0, abs=1e-6)


def test_topk_forward_kl_accepts_raw_logits():
    logits = _student() * 1.0 + 3.7  # shifted log-probs are valid logits of the same distribution
    loss, _ = topk_forward_kl(logits, TEACHER_IDS, _teacher_logp(), MASK)
    assert loss.item() == pytest.approx((FWD_BUCKET_0 + FWD_BUCKET_1) / 2, abs=1e-6)


def test_bucket_penalises_student_mass_outside_teacher_topk_but_renorm_does_not():
    # student has the teacher's shape on ids {0, 1} (1:1) but puts 90% of its mass on ids 2, 3
    student = torch.tensor([[[0.05, 0.05, 0.45, 0.45]]]).log()
    ids = torch.tensor([[[0, 1]]])
    teacher = torch.tensor([[[0.5, 0.5]]]).log()  # teacher tail 0
    _, renorm = topk_forward_kl(student, ids, teacher, torch.ones(1, 1), tail="renorm")
    _, bucket = topk_forward_kl(student, ids, teacher, torch.ones(1, 1), tail="bucket")
    assert renorm.item() == pytest.approx(0.0, abs=1e-6)
    # 2 * 0.5 * log(0.5 / 0.05) = log 10
    assert bucket.item() == pytest.approx(math.log(10.0), abs=1e-5)


def test_bucket_equals_full_kl_when_topk_covers_the_vocab():
    p = [0.1, 0.2, 0.3, 0.4]
    q = [0.4, 0.3, 0.2, 0.1]
    full = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
    ids = torch.tensor([[[3, 2, 1, 0]]])
    teacher = torch.tensor([[[0.4, 0.3, 0.2, 0.1]]]).log()
    _, kl = topk_forward_kl(torch.tensor([[q]]).log(), ids, teacher, torch.ones(1, 1))
    assert kl.item() == pytest.approx(full, abs=1e-5)


def test_topk_forward_kl_gradient_reaches_student_only():
    student = _student(requires_grad=True)
    teacher = _teacher_logp().requires_grad_(True)
    loss, _ = topk_forward_kl(student, TEACHER_IDS, teacher, MASK)
    loss.backward()
    assert torch.isfinite(student.grad).all() and student.grad.abs().sum() > 0
    assert teacher.grad is None


def test_unknown_tail_is_rejected():
    with pytest.raises(ValueError, match="renorm, bucket"):
        topk_forward_kl(_student(), TEACHER_IDS, _teacher_logp(), MASK, tail="drop")


def test_jsd_beta_zero_is_forward_kl_bucket():
    loss_jsd, jsd = generalized_jsd_topk(_student(), TEACHER_IDS, _teacher_logp(), MASK, beta=0.0)
    loss_kl, kl = topk_forward_kl(_student(), TEACHER_IDS, _teacher_logp(), MASK, tail="bucket")
    assert_close(jsd, kl.tolist(), atol=1e-7)
    assert loss_jsd.item() == pytest.approx(loss_kl.item(), abs=1e-7)


def test_jsd_beta_one_is_reverse_kl_bucket_by_hand():
    _, jsd = generalized_jsd_topk(_student(), TEACHER_IDS, _teacher_logp(), torch.tensor([[1, 0]]), beta=1.0)
    # KL(q || p) with q = [0.3, 0.4, 0.3], p = [0.5, 0.3, 0.2]
    expected = 0.3 * math.log(0.3 / 0.5) + 0.4 * math.log(0.4 / 0.3) + 0.3 * math.log(0.3 / 0.2)
    assert jsd[0, 0].item() == pytest.approx(expected, abs=1e-6)


def test_jsd_beta_half_by_hand():
    _, jsd = generalized_jsd_topk(_student(), TEACHER_IDS, _teacher_logp(), torch.tensor([[1, 0]]), beta=0.5)
    # p = [0.5, 0.3, 0.2], q = [0.3, 0.4, 0.3], m = (p + q) / 2 = [0.4, 0.35, 0.25]
    kl_pm = 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.35) + 0.2 * math.log(0.2 / 0.25)
    kl_qm = 0.3 * math.log(0.3 / 0.4) + 0.4 * math.log(0.4 / 0.35) + 0.3 * math.log(0.3 / 0.25)
    assert jsd[0, 0].item() == pytest.approx(0.5 * kl_pm + 0.5 * kl_qm, abs=1e-6)


def test_jsd_beta_weights_the_teacher_side():
    # beta = 0.25: m = 0.25 p + 0.75 q = [0.35, 0.375, 0.275]; loss = 0.25 KL(p || m) + 0.75 KL(q || m)
    _, jsd = generalized_jsd_topk(_student(), TEACHER_IDS, _teacher_logp(), torch.tensor([[1, 0]]), beta=0.25)
    m = [0.25 * 0.5 + 0.75 * 0.3, 0.25 * 0.3 + 0.75 * 0.4, 0.25 * 0.2 + 0.75 * 0.3]
    kl_pm = sum(pi * math.log(pi / mi) for pi, mi in zip([0.5, 0.3, 0.2], m))
    kl_qm = sum(qi * math.log(qi / mi) for qi, mi in zip([0.3, 0.4, 0.3], m))
    assert jsd[0, 0].item() == pytest.approx(0.25 * kl_pm + 0.75 * kl_qm, abs=1e-6)


def test_jsd_over_beta_tends_to_forward_kl_as_beta_goes_to_zero():
    student, teacher = _student(dtype=torch.float64), _teacher_logp(dtype=torch.float64)
    _, jsd = generalized_jsd_topk(student, TEACHER_IDS, teacher, MASK, beta=1e-5)
    assert (jsd[0, 0].item() / 1e-5) == pytest.approx(FWD_BUCKET_0, rel=1e-3)


def test_jsd_is_zero_when_student_matches_teacher():
    q = torch.tensor([[[0.4, 0.3, 0.2, 0.1]]])
    ids = torch.tensor([[[0, 1]]])
    _, jsd = generalized_jsd_topk(q.log(), ids, torch.tensor([[[0.4, 0.3]]]).log(), torch.ones(1, 1), beta=0.5)
    assert jsd.item() == pytest.approx(0.0, abs=1e-7)


def test_jsd_beta_outside_unit_interval_is_rejected():
    with pytest.raises(ValueError, match="beta"):
        generalized_jsd_topk(_student(), TEACHER_IDS, _teacher_logp(), MASK, beta=1.5)


@settings(derandomize=True, max_examples=40, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**16), k=st.integers(min_value=1, max_value=6))
def test_symmetric_jsd_is_between_zero_and_log2(seed, k):
    g = torch.Generator().manual_seed(seed)
    student = torch.log_softmax(3 * torch.randn(2, 3, 6, generator=g), dim=-1)
    teacher_full = torch.log_softmax(3 * torch.randn(2, 3, 6, generator=g), dim=-1)
    top_logp, top_ids = teacher_full.topk(k, dim=-1)
    _, jsd = generalized_jsd_topk(student, top_ids, top_logp, torch.ones(2, 3), beta=0.5)
    assert (jsd >= -1e-6).all()
    assert (jsd <= math.log(2) + 1e-6).all()


S = torch.tensor([[-1.0, -2.0, -0.5]])
T = torch.tensor([[-1.5, -1.0, -9.0]])
M = torch.tensor([[1, 1, 0]])
K1 = [0.5, -1.0]  # s - t
K3 = [math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0]  # log r = t - s = -0.5, 1: r - 1 - log r


@pytest.mark.parametrize(("estimator", "expected"), [("k1", K1), ("k3", K3)])
def test_reverse_kl_sampled_values_by_hand(estimator, expected):
    loss, kl = reverse_kl_sampled(S, T, M, estimator=estimator)
    assert_close(kl, [expected + [0.0]])
    assert loss.item() == pytest.approx(sum(expected) / 2, abs=1e-6)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_reverse_kl_score_function_gradient_is_k1_times_grad_logq(estimator):
    s = S.clone().requires_grad_(True)
    loss, _ = reverse_kl_sampled(s, T, M, estimator=estimator, gradient="score_function")
    loss.backward()
    # d loss / d log q_t = (log q_t - log p_t) / 2 tokens, whatever the value estimator
    assert_close(s.grad, [[0.5 / 2, -1.0 / 2, 0.0]])


def test_reverse_kl_pathwise_gradients_by_hand():
    s = S.clone().requires_grad_(True)
    reverse_kl_sampled(s, T, M, estimator="k1", gradient="pathwise")[0].backward()
    # d (s - t) / ds = 1, over 2 tokens
    assert_close(s.grad, [[0.5, 0.5, 0.0]])
    s.grad = None
    reverse_kl_sampled(s, T, M, estimator="k3", gradient="pathwise")[0].backward()
    # d (e^(t-s) - 1 - (t - s)) / ds = 1 - e^(t-s)
    assert_close(s.grad, [[(1 - math.exp(-0.5)) / 2, (1 - math.exp(1.0)) / 2, 0.0]])


def test_reverse_kl_teacher_gets_no_gradient():
    t = T.clone().requires_grad_(True)
    reverse_kl_sampled(S.clone().requires_grad_(True), t, M)[0].backward()
    assert t.grad is None


def test_reverse_kl_rejects_unknown_estimator_and_gradient():
    with pytest.raises(ValueError, match="k1, k3"):
        reverse_kl_sampled(S, T, M, estimator="k2")
    with pytest.raises(ValueError, match="score_function, pathwise"):
        reverse_kl_sampled(S, T, M, gradient="reparam")


def test_mix_on_policy_frequency_matches_lmbda():
    g = torch.Generator().manual_seed(1234)
    draws = [mix_on_policy(0.3, g) for _ in range(4000)]
    # binomial std sqrt(0.3 * 0.7 / 4000) ~ 0.0072; allow ~4 std
    assert sum(draws) / len(draws) == pytest.approx(0.3, abs=0.03)
    assert all(isinstance(d, bool) for d in draws)


def test_mix_on_policy_endpoints_and_reproducibility():
    g = torch.Generator().manual_seed(0)
    assert not any(mix_on_policy(0.0, g) for _ in range(200))
    assert all(mix_on_policy(1.0, g) for _ in range(200))
    a = [mix_on_policy(0.5, torch.Generator().manual_seed(7)) for _ in range(3)]
    assert len(set(a)) == 1  # same seed, same first draw
    with pytest.raises(ValueError, match="lmbda"):
        mix_on_policy(1.2, g)


def test_reverse_kl_nan_teacher_on_padding_does_not_reach_gradient():
    s = S.clone().requires_grad_(True)
    t = T.clone()
    t[0, 2] = float("nan")
    loss, _ = reverse_kl_sampled(s, t, M, estimator="k3", gradient="pathwise")
    loss.backward()
    assert loss.item() == pytest.approx(sum(K3) / 2, abs=1e-6)
    assert torch.isfinite(s.grad).all()
