"""The thin Ray edge: start (or join) a cluster, reserve a run's placement on it, and start workers there as actors."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
import ray._private.ray_constants as ray_constants
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from asyncrl.calls import wait_with_deadline
from asyncrl.comm.transport import WorkerLocation
from asyncrl.config import RayConfig
from asyncrl.roles.placement import NodeCapacity, Placement, PlacementError, describe_nodes
from asyncrl.trainer.data_parallel import rank_name
from asyncrl.workers.backends import located, send_output_to
from asyncrl.workers.reaper import start_reaper

# Passed to every worker process, so nothing on any worker reaches a model hub and thread counts stay ours.
WORKER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
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

    def on_done(self, callback: Callable[[], None]) -> None:
        self.ref.future().add_done_callback(lambda _f: callback())


class RayHandle:
    """A Ray actor."""

    def __init__(self, actor: Any, name: str, call_timeout_s: float | None = None):
        self.actor, self.name, self.call_timeout_s = actor, name, call_timeout_s
        self._location: WorkerLocation | None = None

    def call(self, method: str, *args: Any, **kwargs: Any) -> RayPending:
        ref = getattr(self.actor, method).remote(*args, **kwargs)
        return RayPending(ref, self.call_timeout_s, f"{self.name}.{method}")

    def kill(self) -> None:
        ray.kill(self.actor)

    def location(self, timeout_s: float | None = None) -> WorkerLocation:
        """Asked once: an actor does not move."""
        if self._location is None:
            ref = self.actor.ray_location.remote(self.name)
            self._location = RayPending(ref, self.call_timeout_s, self.name).result(timeout_s)
        return self._location


_start_reaper_once = functools.cache(start_reaper)  # one watchdog per driver process, whatever clusters it starts
_STARTED: tuple[str, int, int | None] | None = None  # (node id, CPUs, GPUs) of the last local cluster init_ray started


def init_ray(cfg: RayConfig) -> None:
    """Start a private local cluster bound to 127.0.0.1 (``ray.address`` null: even when another cluster runs on
    this machine, which Ray would otherwise join), join the one running here (``auto``), or join ``host:port``.

    A second run in the same process reuses the cluster, unless this function started it with other
    ``ray.num_cpus``/``ray.num_gpus``: then it is restarted with what this run asks for. A cluster the caller
    started (or named) is theirs and is used as it is."""
    global _STARTED
    want = (int(cfg.num_cpus or os.cpu_count() or 1), cfg.num_gpus)
    if ray.is_initialized():
        node = ray.get_runtime_context().get_node_id()
        if cfg.address or _STARTED is None or _STARTED[0] != node or _STARTED[1:] == want:  # not ours, or as wanted
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
        address="local",  # a new cluster of our own, never the one `ray start` left on this machine
        num_cpus=want[0],
        num_gpus=want[1],
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
    _STARTED = (ray.get_runtime_context().get_node_id(), *want)
    _start_reaper_once()  # kills this cluster's processes if the driver is killed (asyncrl.workers.reaper)


def cluster_nodes() -> list[NodeCapacity]:
    """The cluster's alive nodes and their CPUs and GPUs."""
    return [
        NodeCapacity(n["NodeManagerAddress"], float(n["Resources"].get("CPU", 0)), float(n["Resources"].get("GPU", 0)))
        for n in ray.nodes()
        if n.get("Alive")
    ]


@functools.cache
def as_actor(cls: type) -> type:
    """``cls`` as a Ray actor runs it: built with its output sent to its log file first (``log_file``: the worker's
    library chatter stays off the run's console, ``asyncrl.workers.backends``), and with one more call,
    ``ray_location``: where Ray put it (its node, the GPUs it was given)."""

    def __init__(self: Any, *args: Any, log_file: str | None = None, **kwargs: Any) -> None:
        if log_file:
            send_output_to(Path(log_file), Path(log_file).stem)
        cls.__init__(self, *args, **kwargs)

    def ray_location(self: Any, name: str) -> WorkerLocation:
        node, gpus = ray.get_runtime_context().get_node_id(), tuple(str(g) for g in ray.get_gpu_ids())
        return located(self, name, ray.util.get_node_ip_address(), node, gpus)

    return type(cls.__name__, (cls,), {"__init__": __init__, "ray_location": ray_location, "__module__": __name__})


class RayPools:
    """A ``Placement`` reserved on the Ray cluster: one placement group per pool, one bundle per node of the pool
    (STRICT_SPREAD: on distinct nodes when there are several), each worker on its slot's bundle with its share of
    the bundle's CPUs and GPUs and its torch threads (``Placement.slot``), so a run's workers either all fit or fail at
    start, and roles on different pools never compete for the same CPUs or GPUs. ``log_dir``: each worker's output
    goes to ``<log_dir>/<worker>.log``, appended to (docs/outputs.md); null: Ray forwards it to the driver's console."""

    def __init__(self, placement: Placement, ready_timeout_s: float, log_dir: Path | None = None):
        self.placement, self.log_dir = placement, log_dir
        self.pgs: dict[str, PlacementGroup] = {}
        pools = placement.all_pools()
        n_rollout = placement.rollout.ranks if placement.rollout else 0
        shared = len(placement.pools) + n_rollout + placement.actor_ranks - 1 > 1
        self.env = {"env_vars": {**WORKER_ENV, **SHARED_CORES_ENV}} if shared else None
        try:
            # the most constrained pools first (GPUs, then CPUs per node): Ray places each group as it comes, and a
            # small bundle taken from the one node a large one fits on would leave the large one pending
            for name, pool in sorted(pools.items(), key=lambda kv: (-kv[1].gpus, -kv[1].cpus)):
                strategy = "STRICT_SPREAD" if pool.nodes > 1 else "PACK"
                self.pgs[name] = pg = placement_group([pool.bundle()] * pool.nodes, strategy=strategy)
                try:
                    ray.get(pg.ready(), timeout=ready_timeout_s)
                except ray.exceptions.GetTimeoutError:
                    nodes = describe_nodes(cluster_nodes())
                    raise PlacementError(
                        f"pool {name!r} ({pool.describe()}) could not be placed within {ready_timeout_s:g} s "
                        f"(ray.placement_timeout_s) beside the pools already reserved ({', '.join(self.pgs) or 'none'}"
                        f"); the cluster's nodes: {nodes}"
                    ) from None
        except BaseException:
            self.release()
            raise

    def spawn(self, role: str, cls: type, *args: Any, name: str, concurrency: int = 1, **kwargs: Any) -> RayHandle:
        """Start ``cls`` for a training role (``actor`` rank ``rank``, ``critic``, ``reward_model``) or for the
        rollout pool's worker ``rollout:<i>`` on its slot. ``concurrency > 1`` makes a threaded actor (calls run on
        a thread pool), for a worker with a background loop that must still answer calls (the fully_async
        Rollouter)."""
        slot = self.placement.slot(role, kwargs.get("rank", 0))
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=self.pgs[slot.pool], placement_group_bundle_index=slot.node
        )
        opts: dict[str, Any] = {"num_cpus": slot.cpus, "num_gpus": slot.gpus, "scheduling_strategy": strategy}
        if concurrency > 1:
            opts["max_concurrency"] = concurrency
        if self.env:
            opts["runtime_env"] = self.env
        worker = rank_name(name, kwargs.get("rank", 0))
        if self.log_dir is not None:
            kwargs["log_file"] = str(self.log_dir / f"{worker}.log")
        actor = ray.remote(as_actor(cls)).options(**opts).remote(*args, name=name, num_threads=slot.threads, **kwargs)
        return RayHandle(actor, worker)

    def release(self) -> None:
        for pg in self.pgs.values():
            remove_placement_group(pg)
        self.pgs = {}


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()
