"""Every training loop: one module per RL schedule (``trainer.schedule``), each the whole order of events of that
schedule and able to run every algorithm; and the supervised loops (``sft``: the warm start, ``reward_model``:
reward-model training), which have one role and no schedule to choose. ``run.py`` holds what the schedules share."""

from __future__ import annotations

from typing import Any

from asyncrl.config import Config


def run_training(cfg: Config) -> dict[str, Any]:
    """Run ``cfg``'s algorithm on its schedule; returns the run's summary (also written to summary.json)."""
    schedule = cfg.trainer.schedule
    if schedule == "sync":
        from asyncrl.schedules.sync import run_sync as run
    elif schedule == "one_step_off":
        from asyncrl.schedules.one_step_off import run_one_step_off as run
    elif schedule == "two_step_off":
        from asyncrl.schedules.two_step_off import run_two_step_off as run
    elif schedule == "fully_async":
        from asyncrl.schedules.fully_async import run_fully_async as run
    else:
        raise ValueError(f"trainer.schedule={schedule!r}: no such schedule (the config check should have caught it)")
    return run(cfg)
