"""One module per pipeline mode; ``run_pipeline`` picks it from ``trainer.mode``."""

from __future__ import annotations

from typing import Any

from asyncrl.config import Config


def run_pipeline(cfg: Config) -> dict[str, Any]:
    if cfg.trainer.mode == "sync":
        from asyncrl.pipelines.sync import run_sync

        return run_sync(cfg)
    if cfg.trainer.mode == "one_step_off":
        from asyncrl.pipelines.one_step_off import run_one_step_off

        return run_one_step_off(cfg)
    if cfg.trainer.mode == "fully_async":
        from asyncrl.pipelines.fully_async import run_fully_async

        return run_fully_async(cfg)
    if cfg.trainer.mode == "distill":
        from asyncrl.pipelines.distill import run_distill

        return run_distill(cfg)
    if cfg.trainer.mode == "ppo":
        from asyncrl.pipelines.ppo import run_ppo

        return run_ppo(cfg)
    raise NotImplementedError(f"trainer.mode={cfg.trainer.mode!r} is not implemented yet")
