"""A run's roles: started on the chosen backend, reached through typed clients, stopped together.

``start_roles`` reads only what decides which workers exist and where: the training roles the algorithm declared and
their pools (``asyncrl.roles.placement``), where the schedule's rollout runs (``RolloutSide``), the backend, and
each role's spec (``asyncrl.config.specs``), which is all a worker is given. It knows no algorithm and no order of
events.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from asyncrl.calls import Handle
from asyncrl.comm.transport import process_group_transport
from asyncrl.config import Config
from asyncrl.config.specs import RoleSpecs
from asyncrl.roles.clients import (
    CriticClient,
    DataParallelRank,
    DataParallelTrainerClient,
    ProducerClient,
    RewardModelClient,
    Roles,
    RolloutClient,
    RolloutSide,
    RolloutWorkerClient,
    TrainerClient,
)
from asyncrl.roles.placement import resolve_placement
from asyncrl.trainer.data_parallel import rank_name
from asyncrl.workers.backends import IN_PROCESS_LOG, LocalHandle, in_process_chatter_to
from asyncrl.workers.critic import CriticWorker
from asyncrl.workers.reward_model import RewardModelWorker
from asyncrl.workers.rollout import RolloutWorker
from asyncrl.workers.trainer import TrainerWorker

ROLLOUTER_CONCURRENCY = 4  # call threads of the producer: get_batch / pause / metrics while its generation runs
RANK_CONCURRENCY = 4  # call threads of a Rollouter's other rollout rank: a long poll, a submit, an interrupt, a sync


@contextmanager
def start_roles(
    cfg: Config, side: RolloutSide, specs: RoleSpecs, needed: list[str], producer: type | None = None
) -> Iterator[Roles]:
    """Start every worker of the run (``needed``: the training roles the algorithm declared; fails before any starts
    when they do not fit), yield their clients, and stop them all at exit, whatever happened. ``producer``: the
    worker class of a ``STREAM`` schedule's producer, which that schedule owns (fully_async's Rollouter)."""
    backend = _Backend(cfg, needed, side is not RolloutSide.ACTOR)
    try:
        yield _spawn(cfg, side, specs, backend, producer)
    finally:
        backend.close()


def _spawn(cfg: Config, side: RolloutSide, specs: RoleSpecs, backend: _Backend, producer: type | None) -> Roles:
    p = backend.placement
    trainer = _spawn_trainer(cfg, specs, backend)
    roles = Roles(trainer, [trainer, *(RolloutClient(h) for h in trainer.ranks[1:])], p)  # sync: every rank
    ray = backend.ray  # an in-process worker cannot die alone (nor be killed when hung)
    if side is RolloutSide.POOL:

        def rollout_worker(i: int) -> Handle:
            return backend.spawn(f"rollout:{i}", RolloutWorker, specs.rollout, name=f"rollout{i}")

        roles.rollouts = [RolloutClient(rollout_worker(i)) for i in range(cfg.rollout.num_workers)]
        roles.respawn = rollout_worker if ray else None
    elif side is RolloutSide.STREAM:  # the producer on rollout rank 0, driving the pool's other ranks
        if producer is None:
            raise ValueError("start_roles: a streaming schedule's roles need its producer class (producer=None)")
        stream_producer = producer
        stream_ranks = [
            backend.spawn(
                f"rollout:{i}", RolloutWorker, specs.rollout, name=f"rollout{i}", concurrency=RANK_CONCURRENCY
            )
            for i in range(1, cfg.rollout.num_workers)
        ]

        def the_rollouter(_: int = 0) -> Handle:
            h = backend.spawn(
                "rollout:0", stream_producer, specs.rollouter, name="rollouter", concurrency=ROLLOUTER_CONCURRENCY
            )
            timeout = cfg.trainer.role_start_timeout_s
            for rank in stream_ranks:  # a decode a dead Rollouter left running there ends before the next sync
                RolloutWorkerClient(rank).halt(timeout).result(timeout=timeout)
            if stream_ranks:
                ProducerClient(h).attach_ranks(stream_ranks).result(timeout=timeout)
            return h

        roles.rollouter, roles.rollouts, roles.stream_ranks = ProducerClient(the_rollouter()), [], stream_ranks
        roles.respawn = the_rollouter if ray else None
    if "critic" in p.roles:
        roles.critic = CriticClient(backend.spawn("critic", CriticWorker, specs.critic, name="critic"))
    if "reward_model" in p.roles:
        rm = backend.spawn("reward_model", RewardModelWorker, specs.reward_model, name="reward_model")
        roles.reward_model = RewardModelClient(rm)
    roles.handles, roles.rendezvous = list(backend.handles), backend.rendezvous
    return roles


def _spawn_trainer(cfg: Config, specs: RoleSpecs, backend: _Backend) -> TrainerClient:
    """The trainer: one worker, or ``trainer.num_workers`` data-parallel ranks joined in one group."""
    n, spec = cfg.trainer.num_workers, specs.trainer
    if n == 1:
        return TrainerClient(backend.spawn("actor", TrainerWorker, spec, name="trainer"))
    ranks = [backend.spawn("actor", TrainerWorker, spec, name="trainer", rank=r, world_size=n) for r in range(n)]
    timeout = cfg.trainer.role_start_timeout_s
    where = [h.location(timeout) for h in ranks]
    host = where[0].address  # rank 0's node, as the backend knows it: never a loopback constant
    transport = process_group_transport(where)
    host, port = DataParallelRank(ranks[0]).data_parallel_endpoint(host).result()
    joins = [DataParallelRank(h).init_data_parallel(host, port, timeout, transport) for h in ranks]
    for j in joins:
        j.result()
    backend.rendezvous["trainer_data_parallel"] = f"{host}:{port}"
    return DataParallelTrainerClient(ranks, sharded=cfg.trainer.strategy == "fsdp2")


class _Backend:
    """Roles as Ray actors on reserved placement groups of a local (or the configured) cluster, or (``in_process``)
    as objects in this process, each with its own call thread(s): no Ray, no CPU reservation, and their library
    chatter goes to ``RUN_DIR/logs/in_process.log`` while they run (``asyncrl.workers.backends``)."""

    def __init__(self, cfg: Config, needed: list[str], rollout_pool: bool):
        self.ray = cfg.trainer.backend == "ray"
        self.call_timeout_s = cfg.trainer.call_timeout_s
        self.handles: list[Handle] = []
        self.rendezvous: dict[str, str] = {}
        self._chatter = ExitStack()
        logs = Path(cfg.trainer.default_local_dir).resolve() / "logs"  # absolute: a Ray worker's cwd need not be ours
        if not self.ray:
            self.placement = resolve_placement(cfg, needed, rollout_pool, None)
            self._chatter.enter_context(in_process_chatter_to(logs / IN_PROCESS_LOG))
            return
        from asyncrl.workers.cluster import RayPools, cluster_nodes, init_ray

        init_ray(cfg.ray)
        self.placement = resolve_placement(cfg, needed, rollout_pool, cluster_nodes())  # before any worker starts
        self.pools = RayPools(self.placement, ready_timeout_s=cfg.ray.placement_timeout_s, log_dir=logs)

    def spawn(self, role: str, cls: type, *args: Any, name: str, concurrency: int = 1, **kwargs: Any) -> Handle:
        if self.ray:
            h = self.pools.spawn(role, cls, *args, name=name, concurrency=concurrency, **kwargs)
            h.call_timeout_s = self.call_timeout_s
        else:
            worker = cls(*args, name=name, **kwargs)
            h = LocalHandle(worker, rank_name(name, kwargs.get("rank", 0)), concurrency, self.call_timeout_s)
        self.handles.append(h)
        return h

    def close(self) -> None:
        for h in self.handles:
            h.kill()  # frees their CPUs for whatever runs next on this cluster
        if self.ray:
            self.pools.release()
        self._chatter.close()
