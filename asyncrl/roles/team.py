"""A run's roles as one team: the typed client of every worker, where each runs, and how calls to roles on shared
pools take turns. Built whole by ``asyncrl.workers.start.start_roles``; what an algorithm and a schedule call."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asyncrl.calls import Handle, Pending
from asyncrl.comm.transport import WorkerLocation
from asyncrl.roles.clients import (
    CriticClient,
    ProducerClient,
    RewardModelClient,
    RoleClient,
    RolloutClient,
    TrainerClient,
)
from asyncrl.roles.placement import Placement


class RolloutSide(enum.Enum):
    """Where a schedule generates."""

    ACTOR = "actor"  # on the trainer's own worker, with the weights it trains (sync)
    POOL = "pool"  # on rollout.num_workers rollout workers, fed weights over the sync group (one/two_step_off)
    STREAM = "stream"  # on one Rollouter that streams groups through a bounded queue (fully_async)


@dataclass
class Roles:
    """Every role of a run, built whole when the workers start; afterwards only a supervisor changes a member, when
    it replaces a dead rollout worker or Rollouter (``asyncrl.run.supervision``)."""

    trainer: TrainerClient
    rollouts: list[RolloutClient]  # who generates a batch: the trainer itself, or the rollout pool
    placement: Placement
    rollouter: ProducerClient | None = None  # fully_async's producer (its typed client: the schedule's own)
    critic: CriticClient | None = None
    reward_model: RewardModelClient | None = None
    handles: list[Handle] = field(default_factory=list)  # every worker started, once
    respawn: Callable[[int], Handle] | None = None  # a new rollout worker i (Ray's rollout pool: a dead one's stand-in)
    rendezvous: dict[str, str] = field(default_factory=dict)  # group -> host:port of its store (the run's summary)
    stream_ranks: list[Handle] = field(default_factory=list)  # the Rollouter's other rollout ranks (fully_async)

    @property
    def receivers(self) -> list[Handle]:
        """The workers that receive weights from the trainer (none when the trainer's ranks generate themselves)."""
        if self.rollouter is not None:
            return [self.rollouter.handle, *self.stream_ranks]
        return [r.handle for r in self.rollouts if not any(r.handle is h for h in self.trainer.ranks)]

    @property
    def checkpointed(self) -> dict[str, RoleClient]:
        """Roles whose state a checkpoint holds (the rollout side is re-synced from the trainer's weights)."""
        out: dict[str, RoleClient] = {"actor": self.trainer}
        if self.critic is not None:
            out["critic"] = self.critic
        return out

    def locations(self, timeout_s: float | None = None) -> list[WorkerLocation]:
        """Where every worker runs (its node, its GPUs, its device), as the backend reports it."""
        return [h.location(timeout_s) for h in self.handles]

    def timelines(self) -> list[dict]:
        return [e for h in self.handles for e in RoleClient(h).pop_timeline().result()]


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
