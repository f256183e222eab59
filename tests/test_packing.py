"""Packed micro-batches give the padded layout's numbers: per-token log-probs, entropy, every loss, every gradient and
the critic's values agree to float round-off whether a group's prompt is shared (a dense mask), sequences run one per
row to a token budget (no mask), both in one batch, or every sample has its own padded row (``actor.shared_prefix`` /
``actor.use_dynamic_bsz``); and no packed row is wider than the token budget."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from asyncrl import losses
from asyncrl.config import ActorConfig, Config, RolloutCorrectionConfig
from asyncrl.data.collate import Batching, ValueTarget, collate, micro_batches
from asyncrl.data.packing import TokenCount, sharing_pays
from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.trainer.forward import forward_logits
from asyncrl.types import Prompt, Sample
from asyncrl.workers.critic import ValueModel
from tests.helpers import advantages, ppo_update

CHARS = "0123456789 +-="
PADDED = Batching(64)
LAYOUTS = {
    "shared": Batching(64, share_prefix=True),
    "shared_small_micro": Batching(3, share_prefix=True),  # groups split across micro-batches
    "packed_budget": Batching(64, max_tokens=60),  # no sharing, several sequences per row
    "shared_budget": Batching(64, share_prefix=True, max_tokens=45),  # groups split to fit the budget
}


def _batch(tok, groups: int = 5, n: int = 4, long_answers: tuple[int, ...] = ()):
    """``groups`` prompts x ``n`` responses of 0-7 tokens (one empty), with random advantages and log-probs; the
    groups in ``long_answers`` have a 3-token prompt and 12-20-token responses (sharing does not pay there)."""
    rng = random.Random(0)
    samples = []
    for g in range(groups):
        terms = [rng.choice(CHARS[:10]) for _ in range(1 if g in long_answers else rng.randint(2, 7))]
        pid = tok(" + ".join(terms) + " =", add_special_tokens=False)["input_ids"]
        for k in range(n):
            length = 0 if (g, k) == (2, 3) else rng.randint(12, 20) if g in long_answers else rng.randint(1, 7)
            rid = tok("".join(rng.choice(CHARS[:10]) for _ in range(length)), add_special_tokens=False)["input_ids"]
            logp = [-rng.uniform(0.5, 3.0) for _ in rid]
            samples.append(Sample(Prompt(g, pid, "chain_sum", "0"), rid, logp, [0] * len(rid)))
    b = collate(samples, tok.pad_token_id)
    gen = torch.Generator().manual_seed(1)
    adv = torch.randn(b.size, 1, generator=gen) * b.response_mask_BT
    ref = b.behav_logp_BT + 0.3 * torch.randn(b.response_mask_BT.shape, generator=gen) * b.response_mask_BT
    b.policy = advantages(adv)
    b.old_logp_BT, b.ref_logp_BT = b.behav_logp_BT - 0.1 * b.response_mask_BT, ref
    values = torch.randn(b.response_mask_BT.shape, generator=gen) * b.response_mask_BT
    b.value = ValueTarget(values, values + 0.5 * b.response_mask_BT)
    return b


@pytest.fixture(scope="module")
def setup():
    tok = build_char_tokenizer([CHARS])
    return tok, build_model("micro", tok, seed=0), _batch(tok)


@pytest.fixture(scope="module")
def mixed(setup):
    """Groups 1 and 3 of 5 have short prompts and long answers: with a shared prefix, one batch holds both layouts."""
    tok, model, _ = setup
    return tok, model, _batch(tok, long_answers=(1, 3))


MIXED = Batching(64, share_prefix=True, max_tokens=70, knob="actor.ppo_max_token_len_per_gpu")


def _per_token(model, batch, how: Batching):
    logp = torch.zeros_like(batch.response_mask_BT)
    ent = torch.zeros_like(batch.response_mask_BT)
    with torch.no_grad():
        for idx, mb in micro_batches(batch, how):
            logits = forward_logits(model, mb, 0.7)
            T = mb.response_ids_BT.shape[1]
            logp[idx, :T] = losses.logprobs_from_logits(logits, mb.response_ids_BT) * mb.response_mask_BT
            ent[idx, :T] = losses.entropy_from_logits(logits) * mb.response_mask_BT
    return logp, ent


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_log_probs_and_entropy_match_the_padded_layout(setup, layout, attn):
    tok, model, batch = setup
    model = copy.deepcopy(model)
    model.config._attn_implementation = attn
    want_logp, want_ent = _per_token(model, batch, PADDED)
    logp, ent = _per_token(model, batch, LAYOUTS[layout])
    assert want_logp.abs().sum() > 1 and want_ent.abs().sum() > 1  # real numbers, not zeros on both sides
    torch.testing.assert_close(logp, want_logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, want_ent, atol=1e-5, rtol=1e-5)


def _update(model, batch, actor: ActorConfig):
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)  # weights move by exactly the gradient
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    res = ppo_update(model, opt, sched, batch, actor, RolloutCorrectionConfig(), 0.7, num_mini_batches=2, seed=3)
    return model, res


@pytest.mark.parametrize("kl", [False, True])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_losses_and_gradients_match_the_padded_layout(setup, agg, kl):
    tok, model, batch = setup
    common = dict(loss_agg_mode=agg, use_kl_loss=kl, entropy_coeff=0.01, ppo_micro_batch_size=6, ppo_epochs=2)
    want, want_res = _update(model, batch, ActorConfig(shared_prefix=False, use_dynamic_bsz=False, **common))
    variants = [
        ActorConfig(shared_prefix=True, use_dynamic_bsz=False, **common),
        ActorConfig(shared_prefix=True, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=45, **common),
        ActorConfig(shared_prefix=False, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=60, **common),
    ]
    moved = max(float((a - b).detach().abs().max()) for a, b in zip(want.parameters(), model.parameters()))
    assert moved > 1e-3  # the update moved the weights: equal weights below are equal gradients, not two no-ops
    for actor in variants:
        got, res = _update(model, batch, actor)
        for (name, a), b in zip(want.named_parameters(), got.parameters(), strict=True):
            torch.testing.assert_close(b, a, atol=2e-6, rtol=1e-5, msg=f"{name} ({actor.shared_prefix})")
        keys = ["actor/pg_loss", "actor/entropy", "actor/grad_norm"]
        if agg == "token-mean":  # clip fractions are per-token figures: micro-batches weighted by sequences differ
            keys.append("actor/pg_clipfrac")
        for key in keys:
            assert res.metrics[key] == pytest.approx(want_res.metrics[key], rel=1e-4, abs=1e-6), key
        if kl:
            assert res.metrics["actor/kl_loss"] == pytest.approx(want_res.metrics["actor/kl_loss"], rel=1e-4)


def test_critic_values_match_the_padded_layout(setup):
    tok, model, batch = setup
    critic = ValueModel(copy.deepcopy(model))
    torch.nn.init.normal_(critic.value_head.weight, std=0.5)  # a zero head would make every layout agree
    out = {}
    for name, how in {"padded": PADDED, **LAYOUTS}.items():
        v = torch.zeros_like(batch.response_mask_BT)
        with torch.no_grad():
            for idx, mb in micro_batches(batch, how):
                v[idx, : mb.response_mask_BT.shape[1]] = critic(mb) * mb.response_mask_BT
        out[name] = v
    assert out["padded"].abs().sum() > 1
    for name in LAYOUTS:
        torch.testing.assert_close(out[name], out["padded"], atol=1e-5, rtol=1e-5, msg=name)


def test_sharing_processes_each_prompt_once_and_counts_it(setup):
    tok, model, batch = setup
    padded, shared, packed = TokenCount(), TokenCount(), TokenCount()
    micro_batches(batch, PADDED, padded)
    mbs = micro_batches(batch, Batching(64, share_prefix=True), shared)
    micro_batches(batch, Batching(64, max_tokens=60), packed)
    prompt_lens = batch.attention_mask_BL[:, : batch.prompt_width].sum(dim=1)
    resp = int(batch.response_mask_BT.sum())
    assert packed.real == padded.real == padded.unshared == int(prompt_lens.sum()) + resp
    assert shared.real == int(prompt_lens[::4].sum()) + resp  # 5 prompts once each, every response token
    assert shared.unshared == padded.real
    assert len(mbs) == 1 and mbs[0][1].packed.input_ids_RW.shape[0] < batch.size  # fewer rows than samples
    metrics = shared.metrics("actor")
    assert metrics["perf/actor_prefix_saving"] == pytest.approx(1 - shared.real / padded.real)
    assert padded.metrics("actor")["perf/actor_prefix_saving"] == 0.0
    assert packed.metrics("actor")["perf/actor_padding_frac"] < padded.metrics("actor")["perf/actor_padding_frac"]


def test_a_token_budget_smaller_than_one_sample_names_the_setting(setup):
    tok, model, batch = setup
    with pytest.raises(ValueError, match=r"actor\.ppo_max_token_len_per_gpu=8 is smaller than one sample"):
        micro_batches(batch, Batching(64, max_tokens=8, knob="actor.ppo_max_token_len_per_gpu"))


def test_sharing_pays_where_the_prompt_saved_outweighs_the_square():
    assert sharing_pays(2, [1, 1])  # W = 4: 16 <= 2 * 9 / 2 + 1 * 2 * 4
    assert not sharing_pays(2, [2, 2])  # W = 6: 36 > 2 * 16 / 2 + 1 * 2 * 6
    assert not sharing_pays(100, [5])  # one response: nothing to share
    assert not sharing_pays(2048, [8192] * 16)  # verl's DAPO: a short prompt before long responses
    assert not sharing_pays(1000, [1000] * 16)  # W = 17000: 289e6 > 16 * 4e6 / 2 + 15000 * 17000
    assert sharing_pays(2000, [1000] * 16)  # W = 18000: 324e6 <= 16 * 9e6 / 2 + 30000 * 18000


def test_packed_rows_are_bounded_by_the_budget_and_masked_only_where_shared(mixed):
    tok, model, batch = mixed
    kinds = set()
    seen = []
    for idx, mb in micro_batches(batch, MIXED):
        p = mb.packed
        R, W = p.input_ids_RW.shape
        assert W <= MIXED.max_tokens
        seen.extend(idx.tolist())
        if p.per_row:  # one sequence a row from column 0, no mask, at most the budget's positions
            assert p.attention_mask(torch.float32) is None and R * W <= MIXED.max_tokens
            assert ((p.segment_RW >= 0).sum(dim=1) == (p.segment_RW >= 0).long().cumprod(dim=1).sum(dim=1)).all()
            assert (p.position_ids_RW == torch.arange(W)).all()
        else:  # every segment shares its prompt with at least two responses, at most the budget's real tokens
            assert p.attention_mask(torch.float32).shape == (R, 1, W, W) and p.real_tokens <= MIXED.max_tokens
            assert int(p.branch_RW.max()) >= 2
        kinds.add(p.per_row)
    assert kinds == {True, False} and sorted(seen) == list(range(batch.size))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_batch_of_both_layouts_matches_the_padded_one(mixed, attn):
    tok, model, batch = mixed
    model = copy.deepcopy(model)
    model.config._attn_implementation = attn
    want_logp, want_ent = _per_token(model, batch, PADDED)
    logp, ent = _per_token(model, batch, MIXED)
    assert want_logp.abs().sum() > 1
    torch.testing.assert_close(logp, want_logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, want_ent, atol=1e-5, rtol=1e-5)


def test_gradients_of_a_batch_of_both_layouts_match_the_padded_one(mixed):
    tok, model, batch = mixed
    common = dict(loss_agg_mode="token-mean", entropy_coeff=0.01, ppo_micro_batch_size=6, ppo_epochs=1)
    want, want_res = _update(model, batch, ActorConfig(shared_prefix=False, use_dynamic_bsz=False, **common))
    got, res = _update(
        model, batch, ActorConfig(shared_prefix=True, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=70, **common)
    )
    moved = max(float((a - b).detach().abs().max()) for a, b in zip(want.parameters(), model.parameters()))
    assert moved > 1e-3
    for (name, a), b in zip(want.named_parameters(), got.parameters(), strict=True):
        torch.testing.assert_close(b, a, atol=2e-6, rtol=1e-5, msg=name)
    assert res.metrics["actor/pg_loss"] == pytest.approx(want_res.metrics["actor/pg_loss"], rel=1e-4, abs=1e-6)


def test_the_knobs_are_config_keys():
    cfg = Config()
    assert cfg.actor.shared_prefix and cfg.actor.use_dynamic_bsz and cfg.critic.shared_prefix
    assert cfg.actor.ppo_max_token_len_per_gpu == 16384
