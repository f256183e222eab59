"""The RL loops: one module per schedule (``trainer.schedule``), each starting that schedule's run and able to run
every algorithm. ``loops.py`` writes the order of events of the batch schedules once (``fully_async/loop.py``
fully_async's), ``run_ports.py`` builds the run and runs those loops on the real roles; what every schedule shares is
``asyncrl.run``'s. Training from labels (SFT, a reward model) is ``asyncrl.finetune``'s."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from asyncrl.config import Config
from asyncrl.config.specs import RoleSpecs, role_specs


def schedule_module(cfg: Config) -> ModuleType:
    """The module of ``trainer.schedule`` (each of ``config.SCHEDULES``, which the config check holds it to, is a
    module here): its ``run_<name>`` loop, and its ``trainer_plan`` and ``rollout_side`` (where it generates, and its
    producer's worker class or None), which the run (``run_ports.open_run``) and ``asyncrl preflight`` start its
    roles with."""
    return importlib.import_module(f"{__name__}.{cfg.trainer.schedule}")


def specs_for(cfg: Config) -> RoleSpecs:
    """Every role's spec as a run of ``cfg`` builds them: the algorithm's needs, the schedule's plan."""
    from asyncrl.algorithms import algorithm_class

    cls = algorithm_class(cfg)
    return role_specs(cfg, cls.trainer_needs(cfg), schedule_module(cfg).trainer_plan(cfg))


def run_training(cfg: Config) -> dict[str, Any]:
    """Run ``cfg``'s algorithm on its schedule; returns the run's summary (also written to summary.json). A config
    the algorithm refuses (``asyncrl.algorithms.check_config``) or a run on GPUs whose memory plan cannot fit fails
    here, in one line, before anything of the run starts."""
    from asyncrl.algorithms import check_config
    from asyncrl.sizing.check import check_memory

    check_config(cfg)
    check_memory(cfg)
    return getattr(schedule_module(cfg), f"run_{cfg.trainer.schedule}")(cfg)
