"""The memory check a run makes before any worker starts: a plan that cannot fit fails at once, in one line naming
the role, its bytes and the device's, instead of an out-of-memory error minutes into loading a model. It runs only
when the run declares GPUs, against ``trainer.gpu_memory_gb`` or else the GPU this process sees (the roles' GPUs
assumed alike); where neither is known (a CPU-only driver, the key unset) it is skipped, saying so.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from asyncrl.config import Config
from asyncrl.errors import UserInputError
from asyncrl.sizing.memory import MemoryPlan, plan_memory
from asyncrl.sizing.shape import model_shape

log = logging.getLogger(__name__)


class MemoryPlanError(UserInputError, RuntimeError):
    """A role's bytes per GPU exceed the device's: the run cannot start."""


def gpu_roles(cfg: Config) -> tuple[str, ...]:
    """The roles ``cfg`` puts on GPUs: the trainer (``trainer.n_gpus_per_node``), the rollout pool
    (``rollout.n_gpus_per_node``)."""
    return tuple(role for role in ("trainer", "rollout") if getattr(cfg, role).n_gpus_per_node > 0)


def local_device_bytes() -> int | None:
    """The memory of the GPU this process sees (its first), or None without one."""
    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(0).total_memory)


def check_plan(plan: MemoryPlan, roles: tuple[str, ...] = ("trainer", "rollout")) -> None:
    """Raise ``MemoryPlanError`` with one line when a role of ``roles`` (those on GPUs) does not fit (every
    reason, joined by '; ')."""
    problems = [p for p in plan.problems() if p.split(" ", 1)[0] in roles]
    if problems:
        raise MemoryPlanError(
            "memory plan: " + "; ".join(problems) + " — see `asyncrl plan --model MODEL_DIR` for every term"
        )


def check_memory(cfg: Config, device_bytes: int | None = None) -> MemoryPlan | None:
    """Before any worker starts: the plan of ``cfg``'s model (its ``config.json``, on the meta device) on GPUs of
    ``device_bytes`` (None: this process's GPU's), refused in one line when a role cannot fit. Returns the plan, or
    None where the run has no GPUs or the device's size is not known."""
    if not gpu_roles(cfg):
        return None
    if device_bytes is None:
        gb = cfg.trainer.gpu_memory_gb
        device_bytes = int(gb * 1e9) if gb is not None else local_device_bytes()
    if device_bytes is None:
        log.warning(
            "memory plan not checked: the run declares GPUs but this process sees none to size them by "
            "(set trainer.gpu_memory_gb)"
        )
        return None
    if not (Path(cfg.model.path) / "config.json").is_file():
        log.warning("memory plan not checked: model.path %s has no config.json", cfg.model.path)
        return None
    plan = plan_memory(cfg, model_shape(cfg.model.path), device_bytes)
    check_plan(plan, gpu_roles(cfg))
    return plan
