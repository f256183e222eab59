"""One module per pipeline mode; ``run_pipeline`` picks it from ``trainer.mode``."""

from __future__ import annotations

from typing import Any

from asyncrl.config import Config


def run_pipeline(cfg: Config) -> dict[str, Any]:
    if cfg.trainer.mode == "sync":
        from asyncrl.pipelines.sync import run_sync

        return run_sync(cfg)
    raise NotImplementedError(f"trainer.mode={cfg.trainer.mode!r} is not implemented yet")
