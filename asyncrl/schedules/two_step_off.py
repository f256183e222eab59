"""``two_step_off``: batch t+2 generated, t+1 prepared while the roles learn on t (docs/schedules/two_step_off.md)."""

from __future__ import annotations

from typing import Any

from asyncrl.config import Config
from asyncrl.schedules.one_step_off import rollout_side as rollout_side  # one_step_off's pool and plan, re-exported
from asyncrl.schedules.one_step_off import trainer_plan as trainer_plan
from asyncrl.schedules.run_ports import drive


def run_two_step_off(cfg: Config) -> dict[str, Any]:
    """The loop is ``loops.two_step_off``, on the real roles; preparation finishes on a thread of its own."""
    return drive(cfg)
