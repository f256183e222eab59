"""Reward model: training one here from correct vs corrupted answers, scoring, and combining with rule rewards."""

from __future__ import annotations

import math
import random

import pytest
import torch

from asyncrl.config import load_config
from asyncrl.data.dataset import PromptDataset
from asyncrl.data.rows import load_rows
from asyncrl.finetune.reward_model import answer_pairs, corrupt_answer, pairwise_accuracy, train_reward_model
from asyncrl.models.reward_model import load_reward_model, score_ids
from asyncrl.rewards.combine import combine_rewards, token_level_rewards
from asyncrl.schedules import run_training
from asyncrl.telemetry.metrics import read_metrics
from tests.helpers import make_data, make_model, train_overrides


def test_combined_reward_weights_rule_and_squashed_model_score():
    rule = torch.tensor([1.0, 0.0, 1.0])
    logit = torch.tensor([0.0, math.log(3.0), -math.log(3.0)])  # sigmoid: 0.5, 0.75, 0.25
    out = combine_rewards(rule, logit, rule_weight=1.0, rm_weight=2.0)
    assert torch.allclose(out, torch.tensor([2.0, 1.5, 1.5]))
    assert torch.allclose(combine_rewards(rule, logit, 1.0, 0.0), rule)  # weight 0: the rule reward alone
    with pytest.raises(ValueError, match="same \\[B\\] shape"):
        combine_rewards(rule, logit[:2], 1.0, 1.0)


def test_outcome_reward_sits_on_the_last_real_token():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    out = token_level_rewards(torch.tensor([0.7, -1.0, 5.0]), mask)
    assert torch.equal(out, torch.tensor([[0.0, 0.0, 0.7], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))


def test_corrupted_answer_is_a_different_integer():
    rng = random.Random(0)
    assert all(corrupt_answer("12", rng) != "12" for _ in range(50))
    with pytest.raises(ValueError, match="not an integer"):
        corrupt_answer("twelve", rng)


@pytest.fixture(scope="module")
def rm_setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("rm")
    train, test = make_data(root)
    model = make_model(root, train)
    rm_dir = root / "rm"
    summary = train_reward_model([str(train)], [str(test)], str(model), str(rm_dir), steps=30, lr=1e-3, seed=0)
    yield root, model, train, test, rm_dir, summary


def test_train_rm_writes_a_model_that_scores_sequences(rm_setup):
    root, model, train, test, rm_dir, summary = rm_setup
    assert summary["steps"] == 30 and math.isfinite(summary["final_loss"])
    rm, tok = load_reward_model(str(rm_dir), str(model))
    # the summary's accuracy is the saved model's, on the held-out pairs (train_reward_model's seed + 1)
    val = PromptDataset(load_rows([str(test)]), tok, 256)
    pairs = answer_pairs([val[i] for i in range(len(val))], tok, seed=1)
    assert summary["val_pairwise_accuracy"] == pairwise_accuracy(rm.eval(), pairs, tok.pad_token_id)
    logits = score_ids(rm, [[5, 6, 7], [5, 6], [8]], tok.pad_token_id, micro_batch_size=2)
    assert logits.shape == (3,) and torch.isfinite(logits).all()
    # right padding does not change a sequence's score
    alone = score_ids(rm, [[5, 6]], tok.pad_token_id, micro_batch_size=1)
    assert torch.allclose(alone, logits[1:2], atol=1e-5)


def test_reward_model_with_another_tokenizer_is_refused(rm_setup, tmp_path):
    root, model, train, test, rm_dir, _ = rm_setup
    from asyncrl.models.presets import init_model_dir
    from asyncrl.models.tokenizer import build_char_tokenizer

    other = tmp_path / "other"
    init_model_dir("micro", build_char_tokenizer(["xyz"]), str(other), seed=0)
    with pytest.raises(ValueError, match="tokenizer differs from model.path"):
        load_reward_model(str(rm_dir), str(other))


def test_ppo_step_trains_on_rule_plus_reward_model_score(rm_setup):
    root, model, train, test, rm_dir, _ = rm_setup
    run_dir = root / "ppo_rm"
    over = train_overrides(model, train, test, run_dir, 1) + [
        "algorithm.name=ppo",
        "trainer.val_before_train=false",
        "reward_model.enable=true",
        f"reward_model.path={rm_dir}",
        "reward_model.weight=0.5",
        "reward_model.rule_weight=1.0",
        "trainer.backend=in_process",
    ]
    summary = run_training(load_config(None, over))
    m = read_metrics(run_dir / "metrics.jsonl")[-1]
    assert summary["placement"]["roles"]["reward_model"] == "trainer"  # the default: every role on one pool
    assert 0.0 < m["reward/rm_score_mean"] < 1.0 and m["timing_s/reward_model"] > 0
    assert m["reward/mean"] == pytest.approx(m["reward/rule_mean"] + 0.5 * m["reward/rm_score_mean"], abs=1e-5)
