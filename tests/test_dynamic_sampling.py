"""Dynamic sampling (``algorithm.filter_groups``): the keep rule on hand-made groups, each metric's meaning, and the
batch schedules' filler on hand-made generation batches (full batches, discarded surplus, the generation limit)."""

from __future__ import annotations

import pytest

from asyncrl.config import load_config
from asyncrl.rewards.filtering import FilterMetricError, filter_groups, group_by_prompt, keep_group, metric_value
from asyncrl.run.generation import BatchFiller, DynamicSamplingError, Replayed
from asyncrl.types import Prompt, Sample

BASE = ["model.path=m", "data.train_files=[t.parquet]"]


def sample(index: int, reward: float, row: int = 0, epoch: int = 0, **extra: float) -> Sample:
    prompt = Prompt(index=index, prompt_ids=[1, 2], data_source="d", ground_truth="0", epoch=epoch)
    return Sample(prompt, [3, 4], [0.0, 0.0], [0, 0], reward=reward, reward_extra=dict(extra), row=row)


def group(index: int, rewards: list[float], epoch: int = 0, **extras: list[float]) -> list[Sample]:
    return [sample(index, r, row, epoch, **{k: v[row] for k, v in extras.items()}) for row, r in enumerate(rewards)]


# ---- the rule ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "rewards, keep",
    [
        ([1.0, 0.0, 1.0, 1.0], True),
        ([0.0, 0.0, 0.0, 0.0], False),  # all wrong: no advantage anywhere
        ([1.0, 1.0, 1.0, 1.0], False),  # all right
        ([0.1, 0.1, 0.1], False),  # equal values whose float std is not 0 (verl would keep this group)
        ([0.5, 0.5 + 1e-9], True),  # any difference is a spread
        ([0.7], True),  # a group of one has no spread to measure: kept, as verl keeps it
    ],
)
def test_a_group_is_kept_exactly_when_its_metric_differs_between_samples(rewards, keep):
    assert keep_group(group(0, rewards), "seq_reward") is keep


def test_each_metric_reads_what_a_sample_carries():
    # a DAPO-shaped sample: the function's score 1.0 and acc 1.0, minus an overlong penalty of 0.25
    s = sample(0, 0.75, score=1.0, acc=1.0, overlong_reward=-0.25, overlong=1.0, pred=3.0)
    assert [metric_value(s, m) for m in ("acc", "score", "seq_reward", "seq_final_reward", "pred")] == [
        1.0,
        1.0,
        0.75,
        0.75,
        3.0,
    ]
    plain = sample(0, 0.5)  # a function that returned a number, no shaping: every built-in metric is that number
    assert {metric_value(plain, m) for m in ("acc", "score", "seq_reward", "seq_final_reward")} == {0.5}
    binarized = sample(0, 0.0, score=0.8)  # reward.binarize: 0.8 is not a full score; the raw one is kept
    assert (metric_value(binarized, "acc"), metric_value(binarized, "score")) == (0.0, 0.8)
    shaped = sample(0, -0.5, score=0.8, acc=0.0)  # binarize, then an overlong penalty of 0.5 (which records acc)
    assert [metric_value(shaped, m) for m in ("acc", "score", "seq_reward")] == [0.0, 0.8, -0.5]


def test_metrics_disagree_where_shaping_separates_them():
    # every response correct (acc 1) but of different lengths, so the overlong penalty spreads the reward
    g = group(0, [1.0, 0.9, 0.5], acc=[1.0, 1.0, 1.0], score=[1.0, 1.0, 1.0])
    assert not keep_group(g, "acc") and not keep_group(g, "score")
    assert keep_group(g, "seq_reward") and keep_group(g, "seq_final_reward")


def test_a_metric_no_sample_carries_is_an_error_naming_it():
    with pytest.raises(FilterMetricError, match=r"algorithm.filter_groups.metric='accuracy': sample 0:5 row 0 has"):
        keep_group(group(5, [1.0, 0.0], acc=[1.0, 0.0]), "accuracy")


def test_a_group_must_hold_one_prompt_and_at_least_one_sample():
    with pytest.raises(ValueError, match="empty group"):
        keep_group([], "acc")
    with pytest.raises(ValueError, match=r"one prompt \(got prompts \['0:1', '0:2'\]\)"):
        keep_group(group(1, [1.0]) + group(2, [0.0]), "acc")


def test_groups_are_formed_per_prompt_and_epoch_and_filtered_in_order():
    samples = group(3, [1.0, 0.0]) + group(4, [1.0, 1.0]) + group(3, [0.0, 0.0], epoch=1) + group(5, [0.0, 0.5])
    groups = group_by_prompt(samples)
    assert [g[0].uid for g in groups] == ["0:3", "0:4", "1:3", "0:5"]
    kept, dropped = filter_groups(groups, "acc")
    assert [g[0].uid for g in kept] == ["0:3", "0:5"] and dropped == 2


# ---- the filler of the batch schedules -------------------------------------------------------------------------------
def generation_batches(*batches: list[list[float]]) -> list[Replayed]:
    """Generation batches of groups with these rewards, prompt indices numbered on from one batch to the next."""
    out, index = [], 0
    for batch in batches:
        samples = []
        for rewards in batch:
            samples += group(index, rewards)
            index += 1
        out.append(Replayed(samples))
    return out


def filler(*extra: str) -> BatchFiller:
    over = ["data.train_batch_size=4", "actor.ppo_mini_batch_size=2", "algorithm.filter_groups.metric=seq_reward"]
    return BatchFiller(load_config(None, BASE + over + list(extra)))


SPREAD, FLAT = [1.0, 0.0], [1.0, 1.0]


def test_the_filler_generates_until_the_batch_is_full_and_discards_the_surplus():
    batches = generation_batches([SPREAD, FLAT, SPREAD, FLAT], [FLAT, FLAT, FLAT, FLAT], [SPREAD, SPREAD, FLAT, SPREAD])
    launched: list[int] = []

    def more(g: int) -> Replayed:
        launched.append(g)
        return batches[g - 1]

    gen = filler("algorithm.filter_groups.enable=true").fill(1, batches[0], more)
    assert launched == [2, 3]  # the second batch kept nothing, the third filled the batch
    uids = list(dict.fromkeys(s.uid for s in gen.samples))
    assert uids == ["0:0", "0:2", "0:8", "0:9"]  # the first four groups with a spread, in generation order
    assert all(keep_group(g, "seq_reward") for g in group_by_prompt(gen.samples))
    m = gen.metrics
    assert m["train/num_gen_batches"] == 3
    assert (m["dynamic_sampling/groups_generated"], m["dynamic_sampling/groups_kept"]) == (12, 5)
    assert (m["dynamic_sampling/groups_filtered"], m["dynamic_sampling/groups_discarded"]) == (7, 1)
    assert m["dynamic_sampling/groups_trained"] == 4
    assert m["rollout/skipped"] == 1.0  # each batch's own metrics, merged


def test_the_generation_limit_stops_the_run_naming_the_key_and_the_counts():
    batches = generation_batches([SPREAD, FLAT, FLAT, FLAT], [FLAT, FLAT, FLAT, FLAT], [SPREAD] * 4)
    f = filler("algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=2")
    with pytest.raises(DynamicSamplingError) as e:
        f.fill(7, batches[0], lambda g: batches[g - 1])
    message = str(e.value)
    assert message.startswith("algorithm.filter_groups.max_num_gen_batches=2: step 7 generated 2 generation batches")
    assert "(8 groups) and only 1 groups had a spread" in message and "of the 4 data.train_batch_size needs" in message
    assert "set it to 0 for no limit" in message


def test_without_filtering_a_step_is_its_one_generation_batch():
    (only,) = generation_batches([FLAT, FLAT, FLAT, FLAT])
    gen = filler().fill(1, only, lambda g: pytest.fail("no second generation batch without filtering"))
    assert len(gen.samples) == 8 and "train/num_gen_batches" not in gen.metrics
