"""The PPO update leaves out rows whose advantages are all zero (GRPO groups with no reward spread) without changing
the gradient: the weights after an update are the same with and without ``actor.skip_zero_adv_rows``."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from asyncrl.config import ActorConfig, RolloutCorrectionConfig
from asyncrl.data.collate import collate
from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.types import Prompt, Sample
from tests.helpers import advantages, ppo_update

CHARS = "0123456789 +-="


def _batch(tok, adv_per_row: list[float]):
    rng = random.Random(0)
    samples = []
    for i, _ in enumerate(adv_per_row):
        prompt = [rng.choice(CHARS[:10]) for _ in range(rng.randint(3, 7))]
        resp = [rng.choice(CHARS[:10]) for _ in range(rng.randint(1, 4))]
        pid = tok(" + ".join(prompt) + " =", add_special_tokens=False)["input_ids"]
        rid = tok("".join(resp), add_special_tokens=False)["input_ids"]
        logp = [-rng.uniform(0.5, 3.0) for _ in rid]
        samples.append(Sample(Prompt(i // 4, pid, "chain_sum", "0"), rid, logp, [0] * len(rid)))
    b = collate(samples, tok.pad_token_id)
    advantages_BT = torch.tensor(adv_per_row).unsqueeze(1) * b.response_mask_BT
    b.policy = advantages(advantages_BT)
    b.old_logp_BT = b.behav_logp_BT.clone()
    return b


def _update(model, batch, actor: ActorConfig, num_mini: int):
    model = copy.deepcopy(model)
    # SGD: the weights move by exactly lr x gradient, so equal weights mean equal gradients (Adam would magnify
    # float round-off in near-zero gradient entries into lr-sized steps)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    res = ppo_update(model, opt, sched, batch, actor, RolloutCorrectionConfig(), 1.0, num_mini, seed=3)
    return model, res


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_skipping_zero_advantage_rows_gives_the_same_weights(agg):
    torch.manual_seed(0)
    tok = build_char_tokenizer([CHARS])
    model = build_model("micro", tok, seed=0)
    # 6 groups of 4: groups 1, 3 and 4 have no reward spread (all-zero advantages)
    advs = [1.0, -1.0, 0.5, -0.5] + [0.0] * 4 + [1.5, -0.5, -0.5, -0.5] + [0.0] * 8 + [0.7, -0.7, 0.7, -0.7]
    batch = _batch(tok, advs)
    base = dict(loss_agg_mode=agg, ppo_micro_batch_size=3, ppo_epochs=2)
    full, res_full = _update(model, batch, ActorConfig(skip_zero_adv_rows=False, **base), num_mini=2)
    fast, res_fast = _update(model, batch, ActorConfig(skip_zero_adv_rows=True, **base), num_mini=2)

    assert res_fast.optimizer_steps == res_full.optimizer_steps == 4
    assert res_fast.metrics["actor/skipped_rows_frac"] == pytest.approx(12 / 24)
    assert "actor/skipped_rows_frac" not in res_full.metrics
    moved = 0.0
    for (name, a), b in zip(full.named_parameters(), fast.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name
        moved = max(moved, float((a - dict(model.named_parameters())[name]).detach().abs().max()))
    assert moved > 1e-3  # the update did move the weights: the equality above is not two no-ops
    assert res_fast.metrics["actor/grad_norm"] == pytest.approx(res_full.metrics["actor/grad_norm"], rel=1e-4)


def test_a_mini_batch_with_only_zero_advantages_still_steps_the_optimizer_like_the_full_update():
    tok = build_char_tokenizer([CHARS])
    model = build_model("micro", tok, seed=0)
    batch = _batch(tok, [0.0] * 8)
    full, _ = _update(model, batch, ActorConfig(skip_zero_adv_rows=False, ppo_micro_batch_size=4), num_mini=1)
    fast, res = _update(model, batch, ActorConfig(skip_zero_adv_rows=True, ppo_micro_batch_size=4), num_mini=1)
    assert res.optimizer_steps == 1 and res.metrics["actor/skipped_rows_frac"] == 1.0
    for a, b in zip(full.parameters(), fast.parameters(), strict=True):
        assert torch.equal(a, b)  # weight decay alone moved both the same way


def test_rows_are_not_skipped_when_an_entropy_bonus_or_kl_loss_gives_them_a_gradient():
    tok = build_char_tokenizer([CHARS])
    model = build_model("micro", tok, seed=0)
    batch = _batch(tok, [1.0, -1.0, 0.0, 0.0])
    _, res = _update(model, batch, ActorConfig(entropy_coeff=0.01, ppo_micro_batch_size=4), num_mini=1)
    assert "actor/skipped_rows_frac" not in res.metrics
