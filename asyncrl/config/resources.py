"""The resource keys in verl's terms: nodes and GPUs per node for the trainer and for the rollout pool.

``trainer.nnodes`` x ``trainer.n_gpus_per_node`` is the trainer's data-parallel world, one rank per GPU;
``rollout.nnodes`` x ``rollout.n_gpus_per_node`` / ``rollout.tensor_model_parallel_size`` the rollout pool's workers
(engines), each on TP GPUs of one node. ``num_workers`` left at 1 becomes that product; set to anything else it must
agree. Without GPUs, ``nnodes`` spreads ``num_workers`` CPU ranks evenly over that many nodes. Where the pools land
is decided when the run starts (``asyncrl.roles.placement``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from asyncrl.config.errors import ConfigError, check

if TYPE_CHECKING:
    from asyncrl.config.schema import Config


def resolve_ranks(cfg: Config) -> None:
    """Set ``trainer.num_workers`` / ``rollout.num_workers`` from the node and GPU keys where left at 1, and check
    they agree; ``cfg`` is the whole config (``asyncrl.config.schema.Config``)."""
    for key in ("trainer", "rollout"):
        section = getattr(cfg, key)
        nodes, gpus = section.nnodes, section.n_gpus_per_node
        tp = section.tensor_model_parallel_size if key == "rollout" else 1
        if gpus > 0:
            want = nodes * gpus // tp
            if section.num_workers == 1:
                section.num_workers = want
            per = "one rank per GPU" if tp == 1 else f"one engine per {tp} GPUs"
            allowed = f"{want} ({key}.nnodes x {key}.n_gpus_per_node: {per}), or left out"
            check(section.num_workers == want, f"{key}.num_workers", section.num_workers, allowed)
        elif nodes > 1:
            if section.num_workers == 1:
                section.num_workers = nodes
            allowed = f"a multiple of {key}.nnodes ({nodes}): as many ranks on every node"
            check(section.num_workers % nodes == 0, f"{key}.num_workers", section.num_workers, allowed)
    t, r = cfg.trainer, cfg.rollout
    if t.backend == "in_process":
        for key, section in (("trainer", t), ("rollout", r)):
            for name, default in (("nnodes", 1), ("n_gpus_per_node", 0)):
                value = getattr(section, name)
                allowed = (
                    f"{default} with trainer.backend=in_process: its roles run in this process, on trainer.device "
                    "(reserving nodes and GPUs is the Ray backend's)"
                )
                check(value == default, f"{key}.{name}", value, allowed)
    if t.schedule == "sync" and (r.nnodes != 1 or r.n_gpus_per_node != 0):
        raise ConfigError(
            "config keys rollout.nnodes / rollout.n_gpus_per_node: set, but trainer.schedule=sync generates on the "
            "trainer's own workers (no rollout pool); size the trainer with trainer.nnodes / trainer.n_gpus_per_node"
        )
