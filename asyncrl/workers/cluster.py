"""The thin Ray edge: start (or join) a cluster, reserve a run's placement on it, and start workers there as actors."""

from __future__ import annotations

import os
from typing import Any

import ray
import ray._private.ray_constants as ray_constants
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from asyncrl.calls import wait_with_deadline
from asyncrl.config import RayConfig
from asyncrl.roles.placement import ROLLOUT_POOL, Placement, PlacementError
from asyncrl.supervision.reaper import start_reaper
from asyncrl.trainer.data_parallel import rank_name

__all__ = ["PlacementError", "RayHandle", "RayPending", "RayPools", "cluster_cpus", "init_ray", "shutdown"]

# Passed to every worker process, so nothing on any worker reaches a model hub and thread counts stay ours.
WORKER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "MASTER_ADDR": "127.0.0.1",
}
# For workers of runs with several pools: idle OpenMP threads sleep instead of spinning, since a
# spinning pool steals the other worker's core (measured: 2-thread decode fell from ~3,400 to 160 tok/s next to a
# busy process). A lone worker (sync) keeps OpenMP's default, which is faster when nothing else runs.
SHARED_CORES_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


class RayPending:
    def __init__(self, ref: Any, deadline_s: float | None = None, label: str = ""):
        self.ref, self.deadline_s, self.label = ref, deadline_s, label

    def result(self, timeout: float | None = None) -> Any:
        return wait_with_deadline(lambda t: ray.get(self.ref, timeout=t), timeout, self.deadline_s, self.label)

    def done(self) -> bool:
        ready, _ = ray.wait([self.ref], timeout=0)
        return bool(ready)


class RayHandle:
    """A Ray actor."""

    def __init__(self, actor: Any, name: str, call_timeout_s: float | None = None):
        self.actor, self.name, self.call_timeout_s = actor, name, call_timeout_s

    def call(self, method: str, *args: Any, **kwargs: Any) -> RayPending:
        ref = getattr(self.actor, method).remote(*args, **kwargs)
        return RayPending(ref, self.call_timeout_s, f"{self.name}.{method}")

    def kill(self) -> None:
        ray.kill(self.actor)


_REAPER_STARTED = False
_STARTED: tuple[str, int] | None = None  # (node id, CPUs) of the last local cluster init_ray started


def init_ray(cfg: RayConfig) -> None:
    """Start a local single-node cluster bound to 127.0.0.1, or connect to ``ray.address`` when the user gives one.

    A second run in the same process reuses the cluster, unless this function started it with another
    ``ray.num_cpus``: then it is restarted with the CPUs this run asks for. A cluster the caller started is theirs
    and is used as it is."""
    global _STARTED
    want = int(cfg.num_cpus or os.cpu_count() or 1)
    if ray.is_initialized():
        node = ray.get_runtime_context().get_node_id()
        if cfg.address or _STARTED is None or _STARTED[0] != node or _STARTED[1] == want:  # not ours, or as wanted
            return
        ray.shutdown()
    env = dict(WORKER_ENV)
    if cfg.address:
        ray.init(address=cfg.address, runtime_env={"env_vars": env}, log_to_driver=True)
        return
    # Bind every Ray socket to 127.0.0.1. Ray reads this variable once, when `ray` is first imported, so setting it
    # here only reaches the processes Ray starts; the driver's own copy of the flag is set too (without it the
    # cluster of `asyncrl train` listened on every interface: seen with `ss -ltnp`).
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    # Ray starts workers at niceness 15 by default, so on a shared machine any other process outranks the workers
    # that do all of a run's compute (measured: a step 20x slower next to a nice-10 job); run them as the driver runs
    os.environ.setdefault("RAY_worker_niceness", "0")
    for k, v in env.items():
        os.environ.setdefault(k, v)
    ray.init(
        num_cpus=want,
        include_dashboard=False,
        runtime_env={"env_vars": env},
        configure_logging=True,
        logging_level="WARNING",
        log_to_driver=True,
    )
    ip = ray.util.get_node_ip_address()
    if ip != "127.0.0.1":
        ray.shutdown()
        raise RuntimeError(f"the local Ray cluster bound {ip}, not 127.0.0.1: this Ray ignores its loopback flag")
    _STARTED = (ray.get_runtime_context().get_node_id(), want)
    global _REAPER_STARTED
    if not _REAPER_STARTED:  # kills this cluster's processes if the driver is killed (asyncrl.supervision.reaper)
        start_reaper()
        _REAPER_STARTED = True


def cluster_cpus() -> float:
    return float(ray.cluster_resources().get("CPU", 0.0))


class RayPools:
    """A ``Placement`` reserved on the Ray cluster: one placement group of one bundle per training pool (roles on a
    pool share its CPUs) and one of ``n`` bundles for the rollout pool (strategy PACK).

    Reserving the pools up front means a run's workers either all fit or fail at start with a clear message, and
    roles on different pools never compete for the same CPUs. Each role runs ``int(cpus)`` torch threads of its pool,
    so a lone role uses the whole pool and colocated roles time-share it."""

    def __init__(self, placement: Placement, ready_timeout_s: float):
        self.placement = placement
        self.pgs: dict[str, Any] = {}
        n_rollout = placement.rollout[0] if placement.rollout else 0
        shared = len(placement.pools) + n_rollout + placement.actor_ranks - 1 > 1
        self.env = {"env_vars": {**WORKER_ENV, **SHARED_CORES_ENV}} if shared else None
        bundles = {name: [{"CPU": cpus}] for name, cpus in placement.pools.items()}
        if placement.rollout is not None:
            n, cpus = placement.rollout
            bundles[ROLLOUT_POOL] = [{"CPU": cpus}] * n
        try:
            for name, b in bundles.items():
                self.pgs[name] = pg = placement_group(b, strategy="PACK")
                try:
                    ray.get(pg.ready(), timeout=ready_timeout_s)
                except ray.exceptions.GetTimeoutError:
                    raise PlacementError(
                        f"pool {name!r} ({len(b)} x {b[0]['CPU']:g} CPUs) could not be placed within "
                        f"{ready_timeout_s:g} s; the cluster has {cluster_cpus():g} CPUs"
                    ) from None
        except BaseException:
            self.release()
            raise

    def spawn(
        self, role: str, cls: type, *args: Any, name: str, concurrency: int = 1, ranks: int = 1, **kwargs: Any
    ) -> RayHandle:
        """Start ``cls`` for a training role (``actor``, ``critic``, ``reward_model``) on its pool, or for the
        rollout pool's worker ``rollout:<i>``. ``concurrency > 1`` makes a threaded actor (calls run on a thread
        pool), for a worker with a background loop that must still answer calls (the fully_async Rollouter).
        ``ranks``: one of that many data-parallel ranks of the role, which split its share and threads."""
        if role.startswith(ROLLOUT_POOL + ":"):
            pool, index = ROLLOUT_POOL, int(role.split(":")[1])
            cpus = share = self.placement.rollout[1]  # type: ignore[index]
        else:
            pool, index = self.placement.pool_of(role), 0
            cpus = self.placement.pools[pool]
            share = cpus / len(self.placement.roles_on(pool)) / ranks
            cpus = cpus / ranks  # the ranks run at once: each its part of the pool's threads
        strategy = PlacementGroupSchedulingStrategy(placement_group=self.pgs[pool], placement_group_bundle_index=index)
        opts: dict[str, Any] = {"num_cpus": share, "scheduling_strategy": strategy}
        if concurrency > 1:
            opts["max_concurrency"] = concurrency
        if self.env:
            opts["runtime_env"] = self.env
        actor = ray.remote(cls).options(**opts).remote(*args, name=name, num_threads=max(1, int(cpus)), **kwargs)
        return RayHandle(actor, rank_name(name, kwargs.get("rank", 0)))

    def release(self) -> None:
        for pg in self.pgs.values():
            remove_placement_group(pg)
        self.pgs = {}


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()
