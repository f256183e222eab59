"""Placement as config: which resource pool each training role runs on, valid in every schedule.

``placement.pools`` names pools and their CPUs; ``placement.roles`` maps each training role (actor, critic,
reward_model) to a pool. Roles on the same pool time-share its CPUs and a schedule calls them one after another;
roles on different pools get CPUs of their own and their calls overlap (the actor's and the critic's updates at
once: verl's split placement, as config instead of a code edit). The reference and proximal models live in the
actor's worker. The rollout's place is the schedule's: ``sync`` generates on the actor's own worker, the others on a
rollout pool of ``rollout.num_workers`` x ``rollout.cpus_per_worker``.

Empty config = every role of the run on one pool, ``trainer``, of ``trainer.cpus_per_worker`` CPUs (times
``trainer.num_workers``: the actor's data-parallel ranks split their pool's CPUs). Every check
runs before any worker starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.config import Config, PlacementConfig, PoolConfig
from asyncrl.errors import UserInputError

TRAINING_ROLES = ("actor", "critic", "reward_model")
ROLLOUT_POOL = "rollout"
NOT_PLACED = {
    "ref": "the reference model lives in the actor's worker",
    "rollout": "the schedule places the rollout: sync on the actor's worker, the others on rollout.num_workers x "
    "rollout.cpus_per_worker",
}


class PlacementError(UserInputError, RuntimeError):
    """The requested workers do not fit the cluster, or the placement config is inconsistent."""


@dataclass
class Placement:
    pools: dict[str, float]  # training pool -> CPUs
    roles: dict[str, str]  # training role -> pool (only the roles this run uses)
    rollout: tuple[int, float] | None  # (workers, CPUs each) of the rollout pool; None = the actor generates
    actor_ranks: int = 1  # trainer.num_workers data-parallel ranks of the actor, sharing its pool's CPUs

    def pool_of(self, role: str) -> str:
        return self.roles[role]

    def roles_on(self, pool: str) -> list[str]:
        return [r for r, p in self.roles.items() if p == pool]

    def same_pool(self, a: str, b: str) -> bool:
        return self.roles[a] == self.roles[b]

    @property
    def total_cpus(self) -> float:
        n, c = self.rollout or (0, 0.0)
        return sum(self.pools.values()) + n * c


def resolve_placement(cfg: Config, needed: list[str], rollout_pool: bool, total_cpus: float | None) -> Placement:
    """Check ``cfg.placement`` against the training roles this run needs (``needed``, as the algorithm declares
    them), whether the schedule generates on a rollout pool, and ``total_cpus`` (None: no cluster to fit, the
    in-process backend); raise ``PlacementError`` naming the key at fault."""
    p = cfg.placement
    if not p.pools and not p.roles:
        cpus = cfg.trainer.cpus_per_worker * cfg.trainer.num_workers  # each data-parallel rank its CPUs
        p = PlacementConfig(pools={"trainer": PoolConfig(cpus=cpus)})
        p.roles = dict.fromkeys(needed, "trainer")
    for role, pool in p.roles.items():
        if role in NOT_PLACED:
            raise PlacementError(f"placement.roles.{role}: not a placed role ({NOT_PLACED[role]})")
        if role not in TRAINING_ROLES:
            raise PlacementError(f"placement.roles.{role}: unknown role (allowed: {', '.join(TRAINING_ROLES)})")
        if pool not in p.pools:
            known = ", ".join(p.pools) or "none"
            raise PlacementError(f"placement.roles.{role}: pool {pool!r} is not in placement.pools (have: {known})")
    for role in needed:
        if role not in p.roles:
            raise PlacementError(f"placement.roles.{role}: missing (every role this run uses needs a pool)")
    roles = {r: p.roles[r] for r in needed}
    pools: dict[str, float] = {}
    for name, pool in p.pools.items():
        if name == ROLLOUT_POOL:
            raise PlacementError(f"placement.pools.{name}: reserved for the rollout pool (rollout.* keys)")
        if pool.cpus <= 0:
            raise PlacementError(f"placement.pools.{name}.cpus must be > 0 (got {pool.cpus:g})")
        if not any(v == name for v in roles.values()):
            raise PlacementError(f"placement.pools.{name}: empty pool (no role of this run is placed on it)")
        pools[name] = float(pool.cpus)
    r = cfg.rollout
    rollout = (r.num_workers, float(r.cpus_per_worker)) if rollout_pool else None
    placement = Placement(pools=pools, roles=roles, rollout=rollout, actor_ranks=cfg.trainer.num_workers)
    if total_cpus is not None and placement.total_cpus > total_cpus + 1e-9:
        parts = [f"{k}={v:g}" for k, v in pools.items()]
        if rollout is not None:
            parts.append(f"rollout={rollout[0]} x {rollout[1]:g}")
        raise PlacementError(
            f"the roles ask for {placement.total_cpus:g} CPUs ({', '.join(parts)}) but the Ray cluster has "
            f"{total_cpus:g}; lower placement.pools.<name>.cpus, trainer.cpus_per_worker, rollout.num_workers or "
            "rollout.cpus_per_worker, or raise ray.num_cpus"
        )
    return placement
