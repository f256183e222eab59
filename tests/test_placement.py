"""Placement as config: every bad mapping fails at start (before any worker), naming the key at fault."""

from __future__ import annotations

import pytest

from asyncrl.algorithms import algorithm_class
from asyncrl.config import load_config
from asyncrl.roles.placement import PlacementError, resolve_placement

BASE = ["model.path=m", "data.train_files=[t.parquet]", "algorithm.name=ppo", "algorithm.adv_estimator=gae"]
SPLIT = [
    "placement.pools.a.cpus=1",
    "placement.pools.c.cpus=1",
    "placement.roles.actor=a",
    "placement.roles.critic=c",
]


def _resolve(*over: str, cpus: float = 2.0):
    """As a run of that config places its roles: the algorithm's roles, a rollout pool for any schedule but sync."""
    cfg = load_config(None, BASE + list(over))
    needed = algorithm_class(cfg).roles_needed(cfg)
    return resolve_placement(cfg, needed, cfg.trainer.schedule != "sync", total_cpus=cpus)


def test_empty_placement_puts_every_role_on_the_trainer_pool():
    p = _resolve("trainer.cpus_per_worker=2", cpus=2)
    assert p.pools == {"trainer": 2.0} and p.roles == {"actor": "trainer", "critic": "trainer"}
    assert p.rollout is None  # sync: the actor generates
    p = _resolve("reward_model.enable=true", "reward_model.path=rm", "trainer.cpus_per_worker=1", cpus=4)
    assert p.roles == {"actor": "trainer", "critic": "trainer", "reward_model": "trainer"}


def test_placement_holds_in_every_schedule_and_the_rollout_pool_counts():
    p = _resolve(
        *SPLIT, "trainer.schedule=one_step_off", "rollout.num_workers=2", "rollout.cpus_per_worker=0.5", cpus=3
    )
    assert not p.same_pool("actor", "critic") and p.rollout == (2, 0.5) and p.total_cpus == 3.0
    with pytest.raises(PlacementError, match=r"ask for 3 CPUs \(a=1, c=1, rollout=1 x 1\)"):
        _resolve(*SPLIT, "trainer.schedule=fully_async", cpus=2)


def test_explicit_split_and_colocated_mappings_resolve():
    p = _resolve(*SPLIT)
    assert not p.same_pool("actor", "critic")
    p = _resolve("placement.pools.all.cpus=2", "placement.roles={actor: all, critic: all}")
    assert p.same_pool("actor", "critic") and p.roles_on("all") == ["actor", "critic"]


@pytest.mark.parametrize(
    "extra, cpus, fragment",
    [
        (["placement.roles.judge=a"], 2, "placement.roles.judge: unknown role"),
        (["placement.roles.critic=nowhere"], 2, "placement.roles.critic: pool 'nowhere' is not in placement.pools"),
        (["placement.pools.spare.cpus=1"], 3, "placement.pools.spare: empty pool"),
        (["placement.pools.c.cpus=0"], 2, "placement.pools.c.cpus must be > 0"),
        ([], 1.5, "the roles ask for 2 CPUs (a=1, c=1) but the Ray cluster has 1.5"),
        (["placement.roles.ref=c"], 2, "placement.roles.ref: not a placed role (the reference model lives in"),
        (["placement.roles.rollout=a"], 2, "placement.roles.rollout: not a placed role (the schedule places"),
    ],
)
def test_invalid_mapping_is_a_clear_error(extra, cpus, fragment):
    with pytest.raises(PlacementError, match=None) as e:
        _resolve(*SPLIT, *extra, cpus=cpus)
    assert fragment in str(e.value)


def test_a_role_without_a_pool_is_named():
    with pytest.raises(PlacementError, match="placement.roles.critic: missing"):
        _resolve("placement.pools.a.cpus=2", "placement.roles={actor: a}")
    with pytest.raises(PlacementError, match="placement.roles.reward_model: missing"):
        _resolve(*SPLIT, "reward_model.enable=true", "reward_model.path=rm")


def test_a_reward_model_role_is_ignored_when_the_reward_model_is_off():
    p = _resolve(*SPLIT, "placement.roles.reward_model=c")
    assert "reward_model" not in p.roles


def test_bad_ppo_config_values_name_the_key():
    from asyncrl.config import ConfigError

    with pytest.raises(ConfigError, match="algorithm.adv_estimator must be gae or null when algorithm.name=ppo"):
        load_config(None, BASE + ["algorithm.adv_estimator=grpo"])
    with pytest.raises(ConfigError, match="algorithm.lam must be in"):
        load_config(None, BASE + ["algorithm.lam=1.5"])
    with pytest.raises(ConfigError, match="reward_model.path must be a model directory"):
        load_config(None, BASE + ["reward_model.enable=true"])
    with pytest.raises(ConfigError, match="unknown config key 'placement.pools.a.gpus'"):
        load_config(None, BASE + ["placement.pools.a.gpus=1"])
