"""The thin Ray edge: start (or join) a cluster, and place plain-Python workers on it as actors."""

from __future__ import annotations

import os
from typing import Any

import ray

from asyncrl.config import RayConfig

# Passed to every worker process, so nothing on any worker reaches a model hub and thread counts stay ours.
WORKER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "MASTER_ADDR": "127.0.0.1",
}


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
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # binds every Ray socket to 127.0.0.1
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
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
            "lower the *.cpus_per_worker / *.num_workers keys or raise ray.num_cpus"
        )


def spawn(cls: type, num_cpus: float, *args: Any, **kwargs: Any) -> Any:
    """Start ``cls`` as a Ray actor holding ``num_cpus`` CPUs; its torch threads are set from that share."""
    threads = max(1, int(num_cpus))
    actor_cls = ray.remote(cls).options(num_cpus=num_cpus)
    return actor_cls.remote(*args, num_threads=threads, **kwargs)


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()
