"""Online DPO (``algorithm.name: dpo``): the losses against hand-computed values, pairs from reward-ranked groups,
an update that raises the chosen responses' margin, and the same step on two data-parallel ranks as on one.
(2-step runs in every schedule are in tests/test_schedule_matrix.py.)"""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch

from asyncrl.algorithms.dpo import PreferenceTarget, make_pairs
from asyncrl.config import ActorConfig, DpoConfig
from asyncrl.data.collate import collate
from asyncrl.losses.dpo import dpo_loss, sequence_logratios
from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.trainer.forward import response_logprobs
from asyncrl.trainer.update import fit
from asyncrl.types import Prompt, Sample
from tests.test_data_parallel import on_ranks
from tests.test_policy_update import CHARS


def test_sigmoid_and_ipo_losses_match_hand_computed_values():
    chosen, rejected = torch.tensor([1.0, -0.5]), torch.tensor([0.0, 0.5])  # h = [1, -1]
    loss, stats = dpo_loss(chosen, rejected, beta=0.5, loss_type="sigmoid")
    # -log sigmoid(0.5) = log(1 + e^-0.5), -log sigmoid(-0.5) = log(1 + e^0.5)
    want = (math.log(1 + math.exp(-0.5)) + math.log(1 + math.exp(0.5))) / 2
    assert float(loss) == pytest.approx(want, rel=1e-6) and want == pytest.approx(0.724077, abs=1e-6)
    assert stats["dpo/preference_accuracy"] == 0.5
    assert stats["dpo/rewards_chosen"] == pytest.approx(0.5 * 0.25)  # beta x mean chosen log-ratio
    assert stats["dpo/rewards_margin"] == pytest.approx(0.0)
    loss, _ = dpo_loss(chosen, rejected, beta=0.5, loss_type="ipo")  # (h - 1/(2 beta))^2 = [0, 4]
    assert float(loss) == pytest.approx(2.0)
    loss, stats = dpo_loss(chosen, rejected, beta=0.5, weight_P=torch.tensor([1.0, 0.0]))  # the first pair only
    assert float(loss) == pytest.approx(math.log(1 + math.exp(-0.5))) and stats["dpo/preference_accuracy"] == 1.0
    with pytest.raises(ValueError, match="loss_type"):
        dpo_loss(chosen, rejected, beta=0.5, loss_type="hinge")


def test_sequence_logratios_sum_or_average_the_response_tokens():
    logp = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert sequence_logratios(logp, ref, mask).tolist() == [-0.5, 0.5]
    assert sequence_logratios(logp, ref, mask, mean=True).tolist() == [-0.25, 0.5]


def _sample(uid: int, reward: float, failed: bool = False, resp: str = "1") -> Sample:
    s = Sample(
        Prompt(uid, [1, 2, 3], "chain_sum", "0"), [int(c) + 4 for c in resp], [-1.0] * len(resp), [0] * len(resp)
    )
    s.reward, s.reward_failed = reward, failed
    return s


def test_pairs_take_best_and_worst_and_count_ties_and_failures():
    samples = [
        *(_sample(0, r) for r in (0.0, 1.0, 0.5, 1.0)),  # chosen: the first 1.0, rejected: 0.0
        *(_sample(1, 1.0) for _ in range(4)),  # a tie
        *(_sample(2, 0.0, failed=True) for _ in range(4)),  # every reward failed
        _sample(3, 0.0, failed=True),
        _sample(3, 1.0, failed=True),
        _sample(3, 0.2),
        _sample(3, 0.1),  # failed rewards never enter a pair: 0.2 vs 0.1
    ]
    pairs = make_pairs(samples)
    assert [(s.prompt.index, s.reward) for s in pairs.chosen] == [(0, 1.0), (3, 0.2)]
    assert pairs.chosen[0] is samples[1] and [s.reward for s in pairs.rejected] == [0.0, 0.1]
    assert (pairs.groups, pairs.ties, pairs.failed) == (4, 1, 1)
    assert pairs.metrics() == {"dpo/pairs": 2.0, "dpo/tie_rate": 0.25, "dpo/failed_groups": 1.0}


def _pair_batch(tok, model, n_pairs: int = 5):
    gen = torch.Generator().manual_seed(0)
    rows = []
    for i in range(n_pairs):
        for j in range(2):
            resp = "".join(str(int(d)) for d in torch.randint(0, 10, (2 + (i + j) % 3,), generator=gen))
            pid = tok(f"{i} + {j} =", add_special_tokens=False)["input_ids"]
            rid = tok(resp, add_special_tokens=False)["input_ids"]
            rows.append(Sample(Prompt(i, pid, "chain_sum", "0"), rid, [-1.0] * len(rid), [0] * len(rid)))
    b = collate(rows, tok.pad_token_id)
    is_chosen = torch.tensor([1.0, 0.0] * n_pairs)[:, None].expand_as(b.response_mask_BT).clone()
    b.policy = PreferenceTarget(is_chosen, torch.ones_like(b.response_mask_BT), DpoConfig(), 1.0)
    b.ref_logp_BT = response_logprobs(model, b, 1.0, 64)
    return b


def _update(model, batch, dpo: DpoConfig, dp=None, lr: float = 0.05):
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    batch = replace(batch, policy=replace(batch.policy, dpo=dpo))
    res = fit(model, opt, sched, batch, ActorConfig(ppo_micro_batch_size=4), 2, seed=1, dp=dp)
    return model, res


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_an_update_raises_the_margin_of_the_chosen_responses(loss_type):
    tok = build_char_tokenizer([CHARS])
    model = build_model("micro", tok, seed=0)
    batch = _pair_batch(tok, model)
    trained, res = _update(model, batch, DpoConfig(beta=0.5, loss_type=loss_type), lr=0.5)
    assert res.optimizer_steps == 2 and res.metrics["dpo/loss"] > 0
    lr = sequence_logratios(response_logprobs(trained, batch, 1.0, 64), batch.ref_logp_BT, batch.response_mask_BT)
    assert float((lr[0::2] - lr[1::2]).mean()) > 0.05  # the chosen responses gained on the rejected ones


def test_two_ranks_step_as_one():
    tok = build_char_tokenizer([CHARS])
    model = build_model("micro", tok, seed=0)
    batch = _pair_batch(tok, model, n_pairs=7)  # 2 mini-batches of 4 and 3 pairs: uneven shares
    cfg = DpoConfig(beta=0.2)
    one, res_one = _update(model, batch, cfg)
    ranks = on_ranks(2, lambda dp: _update(model, batch, cfg, dp=dp))
    for name, a in one.named_parameters():
        for m, _ in ranks:
            assert torch.allclose(a, dict(m.named_parameters())[name], atol=1e-6), name
    for _, res in ranks:
        assert res.metrics["dpo/loss"] == pytest.approx(res_one.metrics["dpo/loss"], rel=1e-5)
        assert res.metrics["actor/grad_norm"] == pytest.approx(res_one.metrics["actor/grad_norm"], rel=1e-5)
