"""The thin Ray edge: start (or join) a cluster, and place plain-Python workers on it as actors."""

from __future__ import annotations

import os
from typing import Any

import ray
import ray._private.ray_constants as ray_constants
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from asyncrl.config import RayConfig

# Passed to every worker process, so nothing on any worker reaches a model hub and thread counts stay ours.
WORKER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "MASTER_ADDR": "127.0.0.1",
}
# For workers of modes that run several pools at once: idle OpenMP threads sleep instead of spinning, since a
# spinning pool steals the other worker's core (measured: 2-thread decode fell from ~3,400 to 160 tok/s next to a
# busy process). A lone worker (sync) keeps OpenMP's default, which is faster when nothing else runs.
SHARED_CORES_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


class PlacementError(RuntimeError):
    """The requested workers do not fit the cluster."""


def init_ray(cfg: RayConfig) -> None:
    """Start a local single-node cluster bound to 127.0.0.1, or connect to ``ray.address`` when the user gives one."""
    if ray.is_initialized():
        return
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
        num_cpus=cfg.num_cpus or os.cpu_count(),
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


def cluster_cpus() -> float:
    return float(ray.cluster_resources().get("CPU", 0.0))


def check_fits(requests: dict[str, float]) -> None:
    """Fail at start, naming every role, when the roles ask for more CPUs than the cluster has."""
    total = sum(requests.values())
    have = cluster_cpus()
    if total > have + 1e-9:
        parts = ", ".join(f"{k}={v:g}" for k, v in requests.items())
        raise PlacementError(
            f"workers ask for {total:g} CPUs ({parts}) but the Ray cluster has {have:g}; "
            "lower the rollout/trainer cpus_per_worker or num_workers keys, or raise ray.num_cpus"
        )


class ResourcePool:
    """A named Ray placement group of ``num_workers`` bundles of ``cpus_per_worker`` CPUs (strategy PACK).

    Reserving the pool up front means a mode's workers either all fit or fail at start with a clear message, and
    roles on different pools never compete for the same CPUs.
    """

    def __init__(
        self,
        name: str,
        num_workers: int,
        cpus_per_worker: float,
        ready_timeout_s: float = 60.0,
        env: dict[str, str] | None = None,
    ):
        self.name = name
        self.env = dict(env or {})
        self.num_workers = num_workers
        self.cpus_per_worker = cpus_per_worker
        self.pg = placement_group([{"CPU": cpus_per_worker}] * num_workers, strategy="PACK", name="")
        try:
            ray.get(self.pg.ready(), timeout=ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(self.pg)
            raise PlacementError(
                f"resource pool {name!r} ({num_workers} x {cpus_per_worker:g} CPUs) could not be placed within "
                f"{ready_timeout_s:g} s; the cluster has {cluster_cpus():g} CPUs"
            ) from None

    def spawn(self, index: int, cls: type, *args: Any, max_concurrency: int = 1, **kwargs: Any) -> Any:
        """Start ``cls`` on bundle ``index``; its torch threads are set from the bundle's CPU share.

        ``max_concurrency > 1`` makes a threaded actor (calls run on a thread pool), for workers with a background
        loop that must still answer calls (the fully_async Rollouter)."""
        strategy = PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=index)
        opts: dict[str, Any] = {"num_cpus": self.cpus_per_worker, "scheduling_strategy": strategy}
        if max_concurrency > 1:
            opts["max_concurrency"] = max_concurrency
        if self.env:
            opts["runtime_env"] = {"env_vars": {**WORKER_ENV, **self.env}}
        actor_cls = ray.remote(cls).options(**opts)
        return actor_cls.remote(*args, num_threads=max(1, int(self.cpus_per_worker)), **kwargs)

    def release(self) -> None:
        remove_placement_group(self.pg)


def make_pools(pools: dict[str, tuple[int, float]]) -> dict[str, ResourcePool]:
    """``{"trainer": (1, 1.0), "rollout": (2, 0.5)}`` -> reserved pools, after checking they fit the cluster."""
    check_fits({f"{name} ({n} x {c:g})": n * c for name, (n, c) in pools.items()})
    shared = sum(n for n, _ in pools.values()) > 1
    made: dict[str, ResourcePool] = {}
    try:
        for name, (n, c) in pools.items():
            made[name] = ResourcePool(name, n, c, env=SHARED_CORES_ENV if shared else None)
    except BaseException:
        release_pools(made)
        raise
    return made


def release_pools(pools: dict[str, ResourcePool]) -> None:
    for pool in pools.values():
        pool.release()


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()
