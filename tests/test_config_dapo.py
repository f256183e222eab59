"""DAPO's keys as verl spells them: dynamic sampling (``algorithm.filter_groups``, ``data.gen_batch_size``) and the
DAPO reward manager's overlong shaping (``reward_model.reward_manager``, ``reward_model.reward_kwargs``). A verl
user's lines load as written; a wrong one fails at load naming the key (both keys for a combination)."""

from __future__ import annotations

import pytest

from asyncrl.algorithms import check_config
from asyncrl.config import ConfigError, load_config

BASE = ["model.path=m", "data.train_files=[t.parquet]", "data.train_batch_size=8", "actor.ppo_mini_batch_size=4"]
# the DAPO lines of verl's recipe/dapo scripts (values scaled down), + and capitalised booleans as written there
VERL_DAPO = [
    "data.gen_batch_size=24",
    "algorithm.filter_groups.enable=True",
    "algorithm.filter_groups.metric=acc",
    "algorithm.filter_groups.max_num_gen_batches=10",
    "reward_model.reward_manager=dapo",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.len=16",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
    "+reward_model.reward_kwargs.max_resp_len=64",
]


def test_verl_dapo_lines_load_as_written():
    cfg = load_config(None, BASE + VERL_DAPO + ["rollout.response_length=64"])
    fg, rm = cfg.algorithm.filter_groups, cfg.reward_model
    assert (fg.enable, fg.metric, fg.max_num_gen_batches, cfg.data.gen_batch_size) == (True, "acc", 10, 24)
    ob = rm.reward_kwargs.overlong_buffer_cfg
    assert (rm.reward_manager, ob.enable, ob.len, ob.penalty_factor, ob.log) == ("dapo", True, 16, 1.0, False)
    assert rm.reward_kwargs.max_resp_len == 64


def test_the_defaults_are_verls_and_change_nothing():
    cfg = load_config(None, BASE)
    fg, rm = cfg.algorithm.filter_groups, cfg.reward_model
    assert (fg.enable, fg.metric, fg.max_num_gen_batches, cfg.data.gen_batch_size) == (False, "acc", 0, None)
    assert rm.reward_manager == "naive" and not rm.reward_kwargs.overlong_buffer_cfg.enable


@pytest.mark.parametrize("algorithm", ["grpo", "dpo", "ppo"])
def test_every_learning_algorithm_reads_the_reward_manager_and_dynamic_sampling(algorithm):
    cfg = load_config(None, BASE + VERL_DAPO + [f"algorithm.name={algorithm}"])
    assert cfg.reward_model.reward_manager == "dapo" and cfg.algorithm.filter_groups.enable


@pytest.mark.parametrize("schedule", ["sync", "one_step_off", "two_step_off"])
def test_dynamic_sampling_loads_on_each_batch_schedule(schedule):
    assert load_config(None, BASE + VERL_DAPO + [f"trainer.schedule={schedule}"]).trainer.schedule == schedule


def test_filter_keys_without_enable_load_as_verl_scripts_set_them():
    cfg = load_config(None, BASE + ["algorithm.filter_groups.enable=False", "algorithm.filter_groups.metric=score"])
    assert cfg.algorithm.filter_groups.metric == "score"


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["reward_model.reward_kwargs.overlong_buffer=1"], "unknown config key 'reward_model.reward_kwargs.overlong"),
        (["+reward_model.reward_kwargs.foo=1"], "unknown config key 'reward_model.reward_kwargs.foo'"),
        (["algorithm.filter_groups.metrics=acc"], "unknown config key 'algorithm.filter_groups.metrics'"),
        (
            ["reward_model.reward_kwargs.overlong_buffer_cfg.len=long"],
            "config key reward_model.reward_kwargs.overlong_buffer_cfg.len: Value 'long'",
        ),
        (["algorithm.filter_groups.enable=maybe"], "config key algorithm.filter_groups.enable"),
        (
            ["algorithm.filter_groups.max_num_gen_batches=-1"],
            "max_num_gen_batches must be >= 0 (0 = no limit) (got -1)",
        ),
        (["algorithm.filter_groups.metric=' '"], "config key algorithm.filter_groups.metric must be a metric name"),
        (["reward_model.reward_manager=prime"], "config key reward_model.reward_manager must be one of naive, dapo"),
        (["reward_model.reward_kwargs.max_resp_len=0"], "reward_model.reward_kwargs.max_resp_len must be >= 1 or null"),
        (
            [
                "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=true",
                "reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
            ],
            "config key reward_model.reward_manager must be dapo when reward_model.reward_kwargs.overlong_buffer_cfg."
            "enable is true",
        ),
        (
            ["reward_model.reward_manager=dapo", "reward_model.reward_kwargs.overlong_buffer_cfg.enable=true"],
            "config key reward_model.reward_kwargs.overlong_buffer_cfg.len must be >= 1 when",
        ),
        (
            [*VERL_DAPO, "+reward_model.reward_kwargs.max_resp_len=null", "rollout.response_length=8"],
            "overlong_buffer_cfg.len must be <= the max_resp_len it ends at (rollout.response_length: 8) (got 16)",
        ),
        (
            [*VERL_DAPO, "+reward_model.reward_kwargs.max_resp_len=12"],
            "len must be <= the max_resp_len it ends at (reward_model.reward_kwargs.max_resp_len: 12)",
        ),
        (
            ["data.gen_batch_size=24"],
            "config key data.gen_batch_size must be null or data.train_batch_size (8) unless algorithm.filter_groups",
        ),
        (["data.gen_batch_size=0"], "config key data.gen_batch_size must be >= 1 or null (got 0)"),
        (
            [*VERL_DAPO, "trainer.schedule=fully_async", "data.gen_batch_size=null"],
            "config key algorithm.filter_groups.max_num_gen_batches must be 0 when trainer.schedule=fully_async",
        ),
        (
            ["trainer.schedule=fully_async", "data.gen_batch_size=8"],
            "config key data.gen_batch_size must be null when trainer.schedule=fully_async",
        ),
        (
            ["algorithm.name=distill", "teacher.url=http://127.0.0.1:1", "algorithm.filter_groups.enable=true"],
            "config key algorithm.filter_groups.enable must be false when algorithm.name=distill",
        ),
        (
            ["algorithm.name=distill", "teacher.url=http://127.0.0.1:1", *VERL_DAPO[4:]],
            "overlong_buffer_cfg.enable must be false when algorithm.name=distill",
        ),
        (
            ["algorithm.filter_groups.enable=true", "rollout.skip.enable=true", "rollout.skip.action=repeat"],
            "config keys algorithm.filter_groups.enable and rollout.skip.action: dynamic sampling cannot run with "
            "rollout.skip.action=repeat",
        ),
        (
            [
                "algorithm.name=ppo",
                "reward_model.enable=true",
                "reward_model.path=rm",
                "algorithm.filter_groups.enable=true",
                "algorithm.filter_groups.metric=seq_reward",
            ],
            "config key algorithm.filter_groups.metric must be acc or score when reward_model.enable is true",
        ),
        (["reward_model.weight=2"], "config section reward_model: set, but algorithm.name=grpo never reads it"),
    ],
)
def test_a_wrong_dapo_key_fails_before_the_run_starts_naming_it(overrides, fragment):
    """At load, or by the algorithm's own checks (``check_config``), which ``run_training`` runs first."""
    with pytest.raises(ConfigError) as e:
        check_config(load_config(None, BASE + overrides))
    assert fragment in str(e.value)


def test_rollout_skip_cache_works_with_dynamic_sampling():
    over = ["algorithm.filter_groups.enable=true", "rollout.skip.enable=true", "rollout.skip.action=cache"]
    assert load_config(None, BASE + over).rollout.skip.action == "cache"
