"""Placement as config: every bad mapping fails at start (before any worker), naming the key at fault."""

from __future__ import annotations

import pytest

from asyncrl.config import load_config
from asyncrl.workers.cluster import PlacementError
from asyncrl.workers.placement import resolve_placement

BASE = ["model.path=m", "data.train_files=[t.parquet]", "trainer.mode=ppo", "algorithm.adv_estimator=gae"]
SPLIT = [
    "placement.pools.a.cpus=1",
    "placement.pools.c.cpus=1",
    "placement.roles.actor=a",
    "placement.roles.rollout=a",
    "placement.roles.ref=a",
    "placement.roles.critic=c",
]


def _resolve(*over: str, cpus: float = 2.0):
    return resolve_placement(load_config(None, BASE + list(over)), total_cpus=cpus)


def test_empty_placement_is_the_split_default():
    p = _resolve(cpus=2)
    assert p.pools == {"actor_pool": 1.0, "critic_pool": 1.0}
    assert p.roles == {"actor": "actor_pool", "rollout": "actor_pool", "ref": "actor_pool", "critic": "critic_pool"}
    p = _resolve("reward_model.enable=true", "reward_model.path=rm", cpus=4)
    assert p.pools == {"actor_pool": 2.0, "critic_pool": 2.0} and p.roles["reward_model"] == "critic_pool"


def test_explicit_split_and_colocated_mappings_resolve():
    p = _resolve(*SPLIT)
    assert not p.same_pool("actor", "critic") and p.same_pool("actor", "ref")
    p = _resolve("placement.pools.all.cpus=2", "placement.roles={actor: all, rollout: all, ref: all, critic: all}")
    assert p.same_pool("actor", "critic") and p.roles_on("all") == ["actor", "rollout", "ref", "critic"]


@pytest.mark.parametrize(
    "extra, cpus, fragment",
    [
        (["placement.roles.judge=a"], 2, "placement.roles.judge: unknown role"),
        (["placement.roles.critic=nowhere"], 2, "placement.roles.critic: pool 'nowhere' is not in placement.pools"),
        (["placement.pools.spare.cpus=1"], 3, "placement.pools.spare: empty pool"),
        (["placement.pools.c.cpus=0"], 2, "placement.pools.c.cpus must be > 0"),
        ([], 1.5, "placement.pools ask for 2 CPUs (a=1, c=1) but the Ray cluster has 1.5"),
        (["placement.roles.ref=c"], 2, "actor, rollout and ref must share one pool"),
    ],
)
def test_invalid_mapping_is_a_clear_error(extra, cpus, fragment):
    with pytest.raises(PlacementError, match=None) as e:
        _resolve(*SPLIT, *extra, cpus=cpus)
    assert fragment in str(e.value)


def test_a_role_without_a_pool_is_named():
    with pytest.raises(PlacementError, match="placement.roles.critic: missing"):
        _resolve("placement.pools.a.cpus=2", "placement.roles={actor: a, rollout: a, ref: a}")
    with pytest.raises(PlacementError, match="placement.roles.reward_model: missing"):
        _resolve(*SPLIT, "reward_model.enable=true", "reward_model.path=rm")


def test_a_reward_model_role_is_ignored_when_the_reward_model_is_off():
    p = _resolve(*SPLIT, "placement.roles.reward_model=c")
    assert "reward_model" not in p.roles


def test_bad_ppo_config_values_name_the_key():
    from asyncrl.config import ConfigError

    with pytest.raises(ConfigError, match="algorithm.adv_estimator must be gae when trainer.mode=ppo"):
        load_config(None, BASE + ["algorithm.adv_estimator=grpo"])
    with pytest.raises(ConfigError, match="algorithm.lam must be in"):
        load_config(None, BASE + ["algorithm.lam=1.5"])
    with pytest.raises(ConfigError, match="reward_model.path must be a model directory"):
        load_config(None, BASE + ["reward_model.enable=true"])
    with pytest.raises(ConfigError, match="unknown config key 'placement.pools.a.gpus'"):
        load_config(None, BASE + ["placement.pools.a.gpus=1"])
