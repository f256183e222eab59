"""Overlong reward shaping (verl's DAPO reward manager): the penalty on hand-made lengths, its place in scoring
(after binarize, never on a failed sample, on the reward loop too), and its way from verl's keys to every scoring
role through the role specs alone."""

from __future__ import annotations

import pickle

import pytest

from asyncrl.config import load_config
from asyncrl.config.specs import RewardSpec, TrainerNeeds, TrainerPlan, role_specs
from asyncrl.rewards.loop import build_reward_loop, build_scorer
from asyncrl.rewards.overlong import OverlongShaping, overlong_metrics, overlong_penalty
from asyncrl.rewards.reward_fn import RewardFn, build_reward_fn
from asyncrl.types import Prompt, Sample

BASE = ["model.path=m", "data.train_files=[t.parquet]", "rollout.response_length=20"]
# verl's DAPO recipe lines, as written there (Hydra's + included)
DAPO = [
    "reward_model.reward_manager=dapo",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.log=True",
]
REWARDS = """
def one(data_source, solution_str, ground_truth, extra_info):
    return 1.0


def most(data_source, solution_str, ground_truth, extra_info):
    return 0.8


def boom(data_source, solution_str, ground_truth, extra_info):
    raise RuntimeError("no score")
"""


@pytest.fixture
def rewards_file(tmp_path):
    path = tmp_path / "rewards.py"
    path.write_text(REWARDS)
    return path


def samples_of_lengths(*lengths: int) -> list[Sample]:
    out = []
    for i, n in enumerate(lengths):
        s = Sample(Prompt(i, [1, 2], "d", "7"), [5] * n, [-1.0] * n, [0] * n)
        s.response_text = "x" * n
        out.append(s)
    return out


# max_resp_len 20, a buffer of 4: no penalty up to 16 tokens, then 1/4 of penalty_factor per token
@pytest.mark.parametrize(
    "length, factor, penalty",
    [(1, 1.0, 0.0), (10, 1.0, 0.0), (16, 1.0, 0.0), (17, 1.0, -0.25), (18, 1.0, -0.5), (20, 1.0, -1.0)]
    + [(22, 1.0, -1.5), (19, 0.5, -0.375), (20, 0.0, 0.0)],
)
def test_the_penalty_is_dapos_linear_ramp_over_the_buffer(length, factor, penalty):
    assert overlong_penalty(length, max_resp_len=20, buffer_len=4, penalty_factor=factor) == pytest.approx(penalty)


def test_a_buffer_of_no_tokens_is_refused():
    with pytest.raises(ValueError, match="buffer_len must be >= 1 token"):
        overlong_penalty(5, max_resp_len=20, buffer_len=0, penalty_factor=1.0)


def test_scoring_adds_the_penalty_and_logs_it_as_verl_does(rewards_file):
    samples = samples_of_lengths(10, 18, 20)
    RewardFn(f"{rewards_file}:one", overlong=OverlongShaping(20, 4, 1.0, log=True)).score(samples)
    assert [s.reward for s in samples] == pytest.approx([1.0, 0.5, 0.0])
    assert [s.reward_extra["score"] for s in samples] == [1.0, 1.0, 1.0]  # the function's own score
    assert [s.reward_extra["acc"] for s in samples] == [1.0, 1.0, 1.0]  # and the unshaped reward, as verl's acc
    assert [s.reward_extra["overlong_reward"] for s in samples] == pytest.approx([0.0, -0.5, -1.0])
    assert [s.reward_extra["overlong"] for s in samples] == [0.0, 1.0, 1.0]
    assert overlong_metrics(samples) == pytest.approx(
        {"reward/overlong_reward_mean": -0.5, "reward/overlong_frac": 2 / 3}
    )


def test_without_log_only_the_score_is_kept_beside_the_shaped_reward(rewards_file):
    samples = samples_of_lengths(19)
    RewardFn(f"{rewards_file}:one", overlong=OverlongShaping(20, 4, 1.0)).score(samples)
    assert samples[0].reward == pytest.approx(0.25) and samples[0].reward_extra == {"score": 1.0, "acc": 1.0}
    assert overlong_metrics(samples) == {}


def test_the_penalty_follows_binarize_and_spares_a_failed_sample(rewards_file):
    binarized = samples_of_lengths(18)
    fn = RewardFn(f"{rewards_file}:most", binarize=True, overlong=OverlongShaping(20, 4, 1.0))
    fn.score(binarized)  # 0.8 -> 0.0 by binarize, then -0.5 for its length
    assert binarized[0].reward == pytest.approx(-0.5)
    assert binarized[0].reward_extra == {"score": 0.8, "acc": 0.0}  # the raw score; the accuracy before the penalty
    failed = samples_of_lengths(20)
    RewardFn(f"{rewards_file}:boom", overlong=OverlongShaping(20, 4, 1.0)).score(failed)
    assert failed[0].reward_failed and failed[0].reward == 0.0 and failed[0].reward_extra == {}


def test_verl_keys_reach_every_scoring_role_through_its_spec(rewards_file):
    over = BASE + DAPO + [f"reward.custom_function={rewards_file}:one"]
    specs = role_specs(load_config(None, over), TrainerNeeds(), TrainerPlan())
    for reward in (specs.trainer.reward, specs.rollout.reward, specs.rollouter.reward):
        assert isinstance(reward, RewardSpec)
        assert reward.max_resp_len == 20  # reward_kwargs.max_resp_len unset: rollout.response_length
        assert reward.custom_function.endswith(":one")
    reward = pickle.loads(pickle.dumps(specs.rollout.reward))  # as a Ray actor receives it
    # what a rollout worker does with its spec (asyncrl/workers/rollout.py), and the one-call form
    reward_fn = build_reward_fn(reward.custom_function, binarize=reward.binarize)
    for scorer in (build_reward_loop(reward, reward_fn), build_scorer(reward)):
        samples = samples_of_lengths(12, 18)
        scorer.score(samples)
        assert [s.reward for s in samples] == pytest.approx([1.0, 0.5])
        scorer.close()


def test_max_resp_len_when_given_and_no_shaping_without_the_dapo_manager():
    over = (
        BASE
        + DAPO
        + ["+reward_model.reward_kwargs.max_resp_len=40", "+reward_model.reward_kwargs.overlong_buffer_cfg.len=8"]
    )
    spec = RewardSpec.of(load_config(None, over))
    assert OverlongShaping.of(spec) == OverlongShaping(max_resp_len=40, buffer_len=8, penalty_factor=1.0, log=True)
    naive = RewardSpec.of(load_config(None, BASE + ["+reward_model.reward_kwargs.overlong_buffer_cfg.len=8"]))
    assert OverlongShaping.of(naive) is None
    disabled = RewardSpec.of(load_config(None, BASE + ["reward_model.reward_manager=dapo"]))
    assert OverlongShaping.of(disabled) is None
