"""A run's roles: started on the chosen backend, reached through typed clients, stopped together.

``start_roles`` reads only what decides which workers exist: the placement (pools and the training roles on them,
``asyncrl.workers.placement``), where the rollout runs (the schedule's ``RolloutSide``) and ``trainer.backend``. It
knows no algorithm and no order of events.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from asyncrl.calls import Handle, Pending
from asyncrl.config import Config
from asyncrl.workers.actor_worker import ActorRolloutWorker
from asyncrl.workers.backends import LocalHandle
from asyncrl.workers.clients import (
    CriticClient,
    DataParallelTrainerClient,
    RewardModelClient,
    RoleClient,
    RolloutClient,
    RollouterClient,
    TrainerClient,
)
from asyncrl.workers.critic_worker import CriticWorker
from asyncrl.workers.data_parallel import rank_name
from asyncrl.workers.placement import Placement, resolve_placement
from asyncrl.workers.reward_model_worker import RewardModelWorker
from asyncrl.workers.rollout_worker import RolloutWorker
from asyncrl.workers.rollouter import Rollouter
from asyncrl.workers.stream_supervisor import StreamSupervisor
from asyncrl.workers.supervisor import RolloutPool

ROLLOUTER_CONCURRENCY = 4  # call threads of the Rollouter: get_batch / pause / metrics while its generation runs


class RolloutSide(enum.Enum):
    """Where a schedule generates."""

    ACTOR = "actor"  # on the trainer's own worker, with the weights it trains (sync)
    POOL = "pool"  # on rollout.num_workers rollout workers, fed weights over the sync group (one/two_step_off)
    STREAM = "stream"  # on one Rollouter that streams groups through a bounded queue (fully_async)


@dataclass
class Roles:
    trainer: TrainerClient
    rollouts: list[RolloutClient]  # who generates a batch: the trainer itself, or the rollout pool
    placement: Placement
    rollouter: RollouterClient | None = None
    critic: CriticClient | None = None
    reward_model: RewardModelClient | None = None
    handles: list[Handle] = field(default_factory=list)  # every worker started, once
    respawn: Callable[[int], Handle] | None = None  # a new rollout worker i (Ray's rollout pool: a dead one's stand-in)
    pool: RolloutPool | None = None  # supervises the rollout pool once the weight sync exists (Run.start_weight_sync)
    stream: StreamSupervisor | None = None  # supervises the fully_async Rollouter (run_fully_async)

    @property
    def receivers(self) -> list[Handle]:
        """The workers that receive weights from the trainer (none when the trainer's ranks generate themselves)."""
        if self.rollouter is not None:
            return [self.rollouter.handle]
        return [r.handle for r in self.rollouts if not any(r.handle is h for h in self.trainer.ranks)]

    @property
    def checkpointed(self) -> dict[str, RoleClient]:
        """Roles whose state a checkpoint holds (the rollout side is re-synced from the trainer's weights)."""
        out: dict[str, RoleClient] = {"actor": self.trainer}
        if self.critic is not None:
            out["critic"] = self.critic
        return out

    def timelines(self) -> list[dict]:
        return [e for h in self.handles for e in h.call("pop_timeline").result()]


@contextmanager
def start_roles(cfg: Config, side: RolloutSide) -> Iterator[Roles]:
    """Start every worker of the run (fails before any starts when they do not fit), yield their clients, and stop
    them all at exit, whatever happened."""
    backend = _RayBackend(cfg) if cfg.trainer.backend == "ray" else _LocalBackend(cfg)
    try:
        yield _spawn(cfg, side, backend)
    finally:
        backend.close()


def _spawn(cfg: Config, side: RolloutSide, backend: Any) -> Roles:
    p = backend.placement
    trainer = _spawn_trainer(cfg, backend)
    roles = Roles(trainer=trainer, rollouts=[trainer], placement=p)
    roles.rollouts += [RolloutClient(h) for h in trainer.ranks[1:]]  # sync: every rank generates a share
    if side is RolloutSide.POOL:
        n = cfg.rollout.num_workers
        roles.rollouts = [
            RolloutClient(backend.spawn(f"rollout:{i}", RolloutWorker, cfg, name=f"rollout{i}")) for i in range(n)
        ]
        if isinstance(backend, _RayBackend):  # an in-process worker cannot die alone (nor be killed when hung)
            roles.respawn = lambda i: backend.spawn(f"rollout:{i}", RolloutWorker, cfg, name=f"rollout{i}")
    elif side is RolloutSide.STREAM:
        h = backend.spawn("rollout:0", Rollouter, cfg, name="rollouter", concurrency=ROLLOUTER_CONCURRENCY)
        roles.rollouter, roles.rollouts = RollouterClient(h), []
        if isinstance(backend, _RayBackend):
            roles.respawn = lambda i: backend.spawn(
                "rollout:0", Rollouter, cfg, name="rollouter", concurrency=ROLLOUTER_CONCURRENCY
            )
    if "critic" in p.roles:
        roles.critic = CriticClient(backend.spawn("critic", CriticWorker, cfg, name="critic"))
    if "reward_model" in p.roles:
        roles.reward_model = RewardModelClient(
            backend.spawn("reward_model", RewardModelWorker, cfg, name="reward_model")
        )
    roles.handles = list(backend.handles)
    return roles


def _spawn_trainer(cfg: Config, backend: Any) -> TrainerClient:
    """The trainer: one worker, or ``trainer.num_workers`` data-parallel ranks joined in one group."""
    n = cfg.trainer.num_workers
    if n == 1:
        return TrainerClient(backend.spawn("actor", ActorRolloutWorker, cfg, name="trainer"))
    ranks = [
        backend.spawn("actor", ActorRolloutWorker, cfg, name="trainer", ranks=n, rank=r, world_size=n) for r in range(n)
    ]
    host, port = ranks[0].call("data_parallel_endpoint").result()
    timeout = cfg.trainer.role_start_timeout_s
    joins = [h.call("init_data_parallel", host, port, timeout) for h in ranks]
    for j in joins:
        j.result()
    return DataParallelTrainerClient(ranks, sharded=cfg.trainer.strategy == "fsdp2")


class _RayBackend:
    """Roles as Ray actors on reserved placement groups of a local (or the configured) cluster."""

    def __init__(self, cfg: Config):
        from asyncrl.workers.cluster import RayPools, cluster_cpus, init_ray

        init_ray(cfg.ray)
        self.placement = resolve_placement(cfg, cluster_cpus())  # fails here, before any worker starts
        self.pools = RayPools(self.placement, ready_timeout_s=cfg.trainer.role_start_timeout_s)
        self.call_timeout_s = cfg.trainer.call_timeout_s
        self.handles: list[Handle] = []

    def spawn(self, role: str, cls: type, *args: Any, name: str, concurrency: int = 1, **kwargs: Any) -> Handle:
        h = self.pools.spawn(role, cls, *args, name=name, concurrency=concurrency, **kwargs)
        h.call_timeout_s = self.call_timeout_s
        self.handles.append(h)
        return h

    def close(self) -> None:
        for h in self.handles:
            h.kill()  # frees their CPUs for whatever runs next on this cluster
        self.pools.release()


class _LocalBackend:
    """Roles as objects in this process, each with its own call thread(s); no Ray, no CPU reservation."""

    def __init__(self, cfg: Config):
        self.placement = resolve_placement(cfg, None)
        self.call_timeout_s = cfg.trainer.call_timeout_s
        self.handles: list[Handle] = []

    def spawn(
        self, role: str, cls: type, *args: Any, name: str, concurrency: int = 1, ranks: int = 1, **kwargs: Any
    ) -> Handle:
        worker = cls(*args, name=name, **kwargs)
        h = LocalHandle(worker, rank_name(name, kwargs.get("rank", 0)), concurrency, self.call_timeout_s)
        self.handles.append(h)
        return h

    def close(self) -> None:
        for h in self.handles:
            h.kill()


class PoolTurns:
    """Calls to roles on different pools run at once; calls to roles sharing a pool take turns (they would fight
    for its CPUs), in the order issued. ``join`` waits for all of them."""

    def __init__(self, placement: Placement):
        self.placement = placement
        self.pending: dict[str, tuple[str, Any]] = {}
        self.results: dict[str, Any] = {}

    def issue(self, key: str, role: str, call: Callable[[], Pending[Any]]) -> None:
        """Start ``call()`` on ``role``'s worker, after the calls already issued to its pool finished."""
        pool = self.placement.pool_of(role)
        for k, (p, pending) in list(self.pending.items()):
            if p == pool:
                self.results[k] = pending.result()
                del self.pending[k]
        self.pending[key] = (pool, call())

    def join(self) -> dict[str, Any]:
        for k, (_, pending) in self.pending.items():
            self.results[k] = pending.result()
        self.pending = {}
        return self.results
