"""Placement as config: which resource pool each PPO role runs on.

``placement.pools`` names pools and their CPUs; ``placement.roles`` maps each role (actor, rollout, ref, critic,
reward_model) to a pool. Roles on the same pool time-share its CPUs and the pipeline calls them one after another;
roles on different pools get CPUs of their own and the pipeline issues their calls without blocking and joins them
(Ray futures). The actor, rollout and ref roles live in one worker (``ActorRolloutWorker``: it generates with the
weights it trains), so they must share a pool.

Empty config = PPO's split default: ``actor_pool`` (actor+rollout+ref) gets half the cluster's CPUs (at least 1),
``critic_pool`` (critic+reward_model) the rest. Every check runs before any worker starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from asyncrl.config import Config, PlacementConfig
from asyncrl.workers.cluster import SHARED_CORES_ENV, WORKER_ENV, PlacementError, cluster_cpus

ROLES = ("actor", "rollout", "ref", "critic", "reward_model")
POLICY_ROLES = ("actor", "rollout", "ref")  # one worker


@dataclass
class Placement:
    pools: dict[str, float]  # pool name -> CPUs
    roles: dict[str, str]  # role -> pool name (only the roles this run uses)

    def pool_of(self, role: str) -> str:
        return self.roles[role]

    def roles_on(self, pool: str) -> list[str]:
        return [r for r, p in self.roles.items() if p == pool]

    def same_pool(self, a: str, b: str) -> bool:
        return self.roles[a] == self.roles[b]


def default_placement(total_cpus: float, use_reward_model: bool) -> PlacementConfig:
    from asyncrl.config import PoolConfig

    actor_cpus = max(1.0, float(int(total_cpus // 2)))
    critic_cpus = max(1.0, total_cpus - actor_cpus)
    roles = {"actor": "actor_pool", "rollout": "actor_pool", "ref": "actor_pool", "critic": "critic_pool"}
    if use_reward_model:
        roles["reward_model"] = "critic_pool"
    return PlacementConfig(
        pools={"actor_pool": PoolConfig(cpus=actor_cpus), "critic_pool": PoolConfig(cpus=critic_cpus)}, roles=roles
    )


def resolve_placement(cfg: Config, total_cpus: float) -> Placement:
    """Check ``cfg.placement`` against the roles this run needs and ``total_cpus``; raise ``PlacementError`` naming
    the key at fault. Called before any worker starts."""
    p = cfg.placement
    if not p.pools and not p.roles:
        p = default_placement(total_cpus, cfg.reward_model.enable)
    for role, pool in p.roles.items():
        if role not in ROLES:
            raise PlacementError(f"placement.roles.{role}: unknown role (allowed: {', '.join(ROLES)})")
        if pool not in p.pools:
            known = ", ".join(p.pools) or "none"
            raise PlacementError(f"placement.roles.{role}: pool {pool!r} is not in placement.pools (have: {known})")
    needed = ["actor", "rollout", "ref", "critic"] + (["reward_model"] if cfg.reward_model.enable else [])
    for role in needed:
        if role not in p.roles:
            raise PlacementError(f"placement.roles.{role}: missing (every role this run uses needs a pool)")
    policy_pools = {p.roles[r] for r in POLICY_ROLES}
    if len(policy_pools) > 1:
        raise PlacementError(
            "placement.roles: actor, rollout and ref must share one pool (one worker generates with the weights it "
            f"trains); got {', '.join(f'{r}={p.roles[r]}' for r in POLICY_ROLES)}"
        )
    roles = {r: p.roles[r] for r in needed}
    pools: dict[str, float] = {}
    for name, pool in p.pools.items():
        if pool.cpus <= 0:
            raise PlacementError(f"placement.pools.{name}.cpus must be > 0 (got {pool.cpus:g})")
        if not any(v == name for v in roles.values()):
            raise PlacementError(f"placement.pools.{name}: empty pool (no role of this run is placed on it)")
        pools[name] = float(pool.cpus)
    total = sum(pools.values())
    if total > total_cpus + 1e-9:
        parts = ", ".join(f"{k}={v:g}" for k, v in pools.items())
        raise PlacementError(
            f"placement.pools ask for {total:g} CPUs ({parts}) but the Ray cluster has {total_cpus:g}; "
            "lower placement.pools.<name>.cpus or raise ray.num_cpus"
        )
    return Placement(pools=pools, roles=roles)


class RolePools:
    """One Ray placement group (a single bundle) per pool; roles on a pool split its CPUs in Ray's accounting but
    each runs ``int(cpus)`` torch threads, so a lone role uses the whole pool and colocated roles time-share it."""

    def __init__(self, placement: Placement, ready_timeout_s: float = 60.0):
        self.placement = placement
        self.pgs: dict[str, Any] = {}
        self.env = SHARED_CORES_ENV if len(placement.pools) > 1 else {}
        try:
            for name, cpus in placement.pools.items():
                pg = placement_group([{"CPU": cpus}], strategy="PACK")
                self.pgs[name] = pg
                try:
                    ray.get(pg.ready(), timeout=ready_timeout_s)
                except ray.exceptions.GetTimeoutError:
                    raise PlacementError(
                        f"placement.pools.{name} ({cpus:g} CPUs) could not be placed within {ready_timeout_s:g} s; "
                        f"the cluster has {cluster_cpus():g} CPUs"
                    ) from None
        except BaseException:
            self.release()
            raise

    def spawn(self, role: str, cls: type, *args: Any, **kwargs: Any) -> Any:
        pool = self.placement.pool_of(role)
        cpus = self.placement.pools[pool]
        # roles that share a worker (actor/rollout/ref) count once
        sharing = {"policy" if r in POLICY_ROLES else r for r in self.placement.roles_on(pool)}
        strategy = PlacementGroupSchedulingStrategy(placement_group=self.pgs[pool], placement_group_bundle_index=0)
        opts: dict[str, Any] = {"num_cpus": cpus / len(sharing), "scheduling_strategy": strategy}
        if self.env:
            opts["runtime_env"] = {"env_vars": {**WORKER_ENV, **self.env}}
        return ray.remote(cls).options(**opts).remote(*args, num_threads=max(1, int(cpus)), **kwargs)

    def release(self) -> None:
        for pg in self.pgs.values():
            remove_placement_group(pg)
        self.pgs = {}
