"""Placement as config: which resource pool each training role runs on, on how many nodes, with how many GPUs
(``placement.pools``, ``placement.roles``: docs/config.md). Empty config = every role of the run on one pool,
``trainer``: ``trainer.nnodes`` nodes, each holding its share of the actor's ``trainer.num_workers`` data-parallel
ranks, ``trainer.cpus_per_worker`` CPUs and (with ``trainer.n_gpus_per_node``) one GPU per rank. The rollout's place
is the schedule's: ``sync`` generates on the actor's own workers, the others on a rollout pool of
``rollout.num_workers`` workers over ``rollout.nnodes`` nodes, one GPU each where ``rollout.n_gpus_per_node`` > 0.

A pool is one bundle of resources per node; Ray puts a pool's bundles on distinct nodes. Every check here runs before
any worker starts, against the cluster's nodes when there is a cluster (``NodeCapacity``), so a plan the cluster
cannot hold fails at once, naming what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from asyncrl.config import Config, PlacementConfig, PoolConfig, RolloutConfig, TrainerConfig
from asyncrl.errors import UserInputError

TRAINING_ROLES = ("actor", "critic", "reward_model")
ROLLOUT_POOL = "rollout"
NOT_PLACED = {
    "ref": "the reference model lives in the actor's worker",
    "rollout": "the schedule places the rollout: sync on the actor's workers, the others on rollout.num_workers x "
    "rollout.cpus_per_worker (rollout.nnodes, rollout.n_gpus_per_node)",
}
EPS = 1e-9


class PlacementError(UserInputError, RuntimeError):
    """The requested workers do not fit the cluster, or the placement config is inconsistent."""


@dataclass(frozen=True)
class Pool:
    """``nodes`` bundles of ``cpus`` and ``gpus`` each, one per node; ``ranks`` workers of the pool's main role
    (the actor's data-parallel ranks, the rollout workers) spread evenly over them."""

    cpus: float  # per node
    gpus: float = 0.0  # per node
    nodes: int = 1
    ranks: int = 1

    @property
    def per_node(self) -> int:
        return max(1, self.ranks // self.nodes)

    def node_of(self, rank: int) -> int:
        return min(self.nodes - 1, rank // self.per_node)

    @classmethod
    def spread(cls, c: TrainerConfig | RolloutConfig) -> Pool:
        """The trainer's or the rollout's workers spread evenly over its nodes, ``cpus_per_worker`` CPUs each."""
        per_node = c.num_workers // c.nnodes
        return cls(c.cpus_per_worker * per_node, float(c.n_gpus_per_node), c.nnodes, c.num_workers)

    def bundle(self) -> dict[str, float]:
        return {"CPU": self.cpus, **({"GPU": self.gpus} if self.gpus else {})}

    def describe(self) -> str:
        one = f"{self.cpus:g} CPUs" + (f", {self.gpus:g} GPUs" if self.gpus else "")
        return f"{self.nodes} nodes x ({one})" if self.nodes > 1 else one


@dataclass(frozen=True)
class Slot:
    """Where one worker goes: its pool, the pool's node (bundle) index, the resources it reserves there, and the
    torch threads it runs."""

    pool: str
    node: int
    cpus: float
    gpus: float
    threads: int


@dataclass(frozen=True)
class NodeCapacity:
    """One alive node of the cluster: its address and its CPUs and GPUs."""

    address: str
    cpus: float
    gpus: float = 0.0


@dataclass
class Placement:
    pools: dict[str, Pool]  # training pool -> its resources
    roles: dict[str, str]  # training role -> pool (only the roles this run uses)
    rollout: Pool | None  # the rollout pool (ranks = rollout workers); None = the actor generates
    actor_ranks: int = 1  # trainer.num_workers data-parallel ranks of the actor, spread over its pool's nodes

    def pool_of(self, role: str) -> str:
        return self.roles[role]

    def roles_on(self, pool: str) -> list[str]:
        return [r for r, p in self.roles.items() if p == pool]

    def same_pool(self, a: str, b: str) -> bool:
        return self.roles[a] == self.roles[b]

    def all_pools(self) -> dict[str, Pool]:
        return {**self.pools, **({ROLLOUT_POOL: self.rollout} if self.rollout is not None else {})}

    @property
    def total_cpus(self) -> float:
        return sum(p.cpus * p.nodes for p in self.all_pools().values())

    @property
    def total_gpus(self) -> float:
        return sum(p.gpus * p.nodes for p in self.all_pools().values())

    def slot(self, role: str, rank: int = 0) -> Slot:
        """Where ``role`` (``actor`` rank ``rank``, ``critic``, ``reward_model``, or ``rollout:<i>``) runs and what
        it reserves. Ranks of the pool's main role split their node's bundle; roles sharing a pool split each
        rank's part (they take turns on it), the other roles living on the pool's first node."""
        if role.startswith(ROLLOUT_POOL + ":"):
            pool, p = ROLLOUT_POOL, self.rollout
            if p is None:
                raise PlacementError(f"{role}: this run has no rollout pool")
            index = int(role.split(":")[1])
            node, sharing = p.node_of(index), 1
        else:
            pool = self.pool_of(role)
            p = self.pools[pool]
            node = p.node_of(rank) if role == "actor" else 0
            sharing = len(self.roles_on(pool))
        cpus, gpus = p.cpus / p.per_node, p.gpus / p.per_node
        return Slot(pool, node, cpus / sharing, gpus / sharing, max(1, int(cpus)))


def resolve_placement(
    cfg: Config, needed: list[str], rollout_pool: bool, cluster: list[NodeCapacity] | None
) -> Placement:
    """Check ``cfg.placement`` against the training roles this run needs (``needed``, as the algorithm declares
    them), whether the schedule generates on a rollout pool, and the ``cluster``'s nodes (None: no cluster to fit,
    the in-process backend); raise ``PlacementError`` naming the key at fault or what the cluster lacks."""
    p, t = cfg.placement, cfg.trainer
    default = not p.pools and not p.roles
    if default:
        p = PlacementConfig({"trainer": PoolConfig(cpus=t.cpus_per_worker)}, dict.fromkeys(needed, "trainer"))
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
    pools: dict[str, Pool] = {}
    for name, pool in p.pools.items():
        if name == ROLLOUT_POOL:
            raise PlacementError(f"placement.pools.{name}: reserved for the rollout pool (rollout.* keys)")
        if pool.cpus <= 0:
            raise PlacementError(f"placement.pools.{name}.cpus must be > 0 (got {pool.cpus:g})")
        if pool.gpus < 0:
            raise PlacementError(f"placement.pools.{name}.gpus must be >= 0 (got {pool.gpus:g})")
        if not any(v == name for v in roles.values()):
            raise PlacementError(f"placement.pools.{name}: empty pool (no role of this run is placed on it)")
        pools[name] = Pool(cpus=float(pool.cpus), gpus=float(pool.gpus))
    actor_pool = roles.get("actor")
    if actor_pool is not None:
        if default:  # the trainer keys size it: per node, each rank its CPUs and (with GPUs) one GPU
            a = Pool.spread(t)
        elif t.nnodes > 1 or t.n_gpus_per_node:
            raise PlacementError(
                "trainer.nnodes / trainer.n_gpus_per_node size the default trainer pool; with placement.pools "
                f"give the actor's pool its resources there (placement.pools.{actor_pool}.cpus / .gpus)"
            )
        else:
            a = replace(pools[actor_pool], ranks=t.num_workers)
        pools[actor_pool] = a
        others = [r for r, q in roles.items() if q == actor_pool and r != "actor"]
        if a.gpus and a.per_node > 1 and others:
            raise PlacementError(
                f"placement: {', '.join(others)} shares the actor's pool {actor_pool!r}, whose nodes hold "
                f"{a.per_node} GPU ranks each; sharing GPUs between several ranks and another role is not "
                "implemented: give it a pool of its own (placement.pools.<name>.gpus, placement.roles)"
            )
    rollout = Pool.spread(cfg.rollout) if rollout_pool else None
    placement = Placement(pools=pools, roles=roles, rollout=rollout, actor_ranks=t.num_workers)
    if cluster is not None:
        check_fits(placement, cluster)
    return placement


def describe_nodes(cluster: list[NodeCapacity]) -> str:
    """The cluster's nodes as an error message names them."""
    return "; ".join(f"{n.address}: {n.cpus:g} CPUs, {n.gpus:g} GPUs" for n in cluster)


def check_fits(placement: Placement, cluster: list[NodeCapacity]) -> None:
    """Raise ``PlacementError`` when the cluster cannot hold the plan: too few CPUs or GPUs in all, a pool whose
    per-node bundle fits on fewer nodes than it spans, or pools that fit one by one but not together (an exact
    search, for plans of a few dozen bundles; a larger one that it cannot settle is left to Ray's reservation, which
    fails after ``ray.placement_timeout_s``). Resources other runs hold are not seen here: Ray's deadline covers
    those too."""
    have_cpus = sum(n.cpus for n in cluster)
    have_gpus = sum(n.gpus for n in cluster)
    parts = [f"{name}={p.describe()}" for name, p in placement.all_pools().items()]
    nodes = describe_nodes(cluster)
    if placement.total_cpus > have_cpus + EPS:
        raise PlacementError(
            f"the roles ask for {placement.total_cpus:g} CPUs ({', '.join(parts)}) but the Ray cluster has "
            f"{have_cpus:g}; lower placement.pools.<name>.cpus, trainer.cpus_per_worker, rollout.num_workers or "
            "rollout.cpus_per_worker, or raise ray.num_cpus"
        )
    if placement.total_gpus > have_gpus + EPS:
        raise PlacementError(
            f"the roles ask for {placement.total_gpus:g} GPUs ({', '.join(parts)}) but the Ray cluster has "
            f"{have_gpus:g} (nodes: {nodes}); lower trainer/rollout n_gpus_per_node or nnodes, or add GPU nodes"
        )
    for name, pool in placement.all_pools().items():
        fit = [n for n in cluster if n.cpus + EPS >= pool.cpus and n.gpus + EPS >= pool.gpus]
        if len(fit) < pool.nodes:
            key = f"{name}.nnodes" if name in ("trainer", ROLLOUT_POOL) else f"placement.pools.{name}"
            raise PlacementError(
                f"pool {name!r} needs {pool.nodes} node(s) with {pool.bundle()['CPU']:g} CPUs and {pool.gpus:g} "
                f"GPUs each but the Ray cluster has {len(fit)} such node(s) (nodes: {nodes}); check {key} and the "
                "per-node keys"
            )
    if _packs(list(placement.all_pools().values()), [[n.cpus, n.gpus] for n in cluster]) is False:
        raise PlacementError(
            f"the pools ({', '.join(parts)}) each fit the Ray cluster but not all together (nodes: {nodes}); "
            "lower a pool's per-node resources or nnodes, or add nodes"
        )


def _packs(pools: list[Pool], free: list[list[float]], budget: list[int] | None = None) -> bool | None:
    """Whether every pool's bundles go on distinct nodes of ``free`` ([CPUs, GPUs] left per node) at once: True,
    False, or None when the search ran out of its step budget."""
    budget = budget if budget is not None else [20_000]
    if not pools:
        return True
    pool, rest = pools[0], pools[1:]

    def place(start: int, left: int) -> bool | None:
        if left == 0:
            return _packs(rest, free, budget)
        undecided = False
        for i in range(start, len(free)):
            budget[0] -= 1
            if budget[0] < 0:
                return None
            node = free[i]
            if node[0] + EPS < pool.cpus or node[1] + EPS < pool.gpus:
                continue
            node[0] -= pool.cpus
            node[1] -= pool.gpus
            got = place(i + 1, left - 1)
            node[0] += pool.cpus
            node[1] += pool.gpus
            if got:
                return True
            undecided = undecided or got is None
        return None if undecided else False

    return place(0, pool.nodes)
