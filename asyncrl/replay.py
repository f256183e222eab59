"""Deterministic replay of a run's trainer side (``trainer.record_consumed`` + ``asyncrl replay RUN_DIR``;
docs/replay.md). The run records each step's samples as the algorithm received them (order, groups, every token's
version) before the update and a crc32 per weight tensor after it (``asyncrl.run.directory``); replay starts the
trainer in this process from the run's config and torch thread count, feeds it those samples through the same
algorithm, and compares its weights with the run's, its checkpoints and final model. Only algorithms whose batch is a
function of the samples alone (``replayable``: ``grpo``, ``dpo``) are replayed; others are refused with an error.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from asyncrl.checkpoint import fingerprint, load_tensors
from asyncrl.errors import UserInputError
from asyncrl.run.directory import CONSUMED_DIR, step_of


class ReplayError(UserInputError, RuntimeError):
    """The run cannot be replayed (nothing recorded, a step missing, an algorithm with other roles)."""


def _first_difference(mine: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> str | None:
    common = sorted(set(theirs) & set(mine))  # a tied weight is saved once
    if not common:
        raise ReplayError(f"replay: no tensor name in common with the saved weights (e.g. {sorted(theirs)[:2]})")
    for name in common:
        if not torch.equal(mine[name], theirs[name]):
            return f"{name} (max |diff| {float((mine[name] - theirs[name]).abs().max()):.3e})"
    return None


def replay(run_dir: str | Path) -> dict[str, Any]:
    """Re-run the trainer side of ``run_dir`` on its recorded samples; returns what matched."""
    from asyncrl.algorithms import algorithm_class
    from asyncrl.config import load_config
    from asyncrl.models.loading import load_tokenizer_from
    from asyncrl.roles.clients import RolloutSide
    from asyncrl.schedules import specs_for
    from asyncrl.telemetry.metrics import read_metrics
    from asyncrl.workers.start import start_roles

    run = Path(run_dir)
    if not (run / "config.yaml").is_file():
        raise ReplayError(f"{run}: no config.yaml (not a run directory)")
    cfg = load_config(str(run / "config.yaml"), [])
    cls = algorithm_class(cfg)
    if not cls.replayable:
        raise ReplayError(
            f"{run}: algorithm.name={cfg.algorithm.name} is not replayable (its batch depends on another role's "
            "state; an algorithm declares Algorithm.replayable when its batch is a function of the samples alone)"
        )
    recorded = sorted((run / CONSUMED_DIR).glob("step_*.pkl"), key=step_of)
    if not recorded:
        raise ReplayError(f"{run}: nothing recorded (run it with trainer.record_consumed=true)")
    steps = [step_of(p) for p in recorded]
    if steps != list(range(1, len(steps) + 1)):
        raise ReplayError(f"{run}: recorded steps {steps[:3]}...{steps[-3:]} are not 1..N")
    threads = [int(t) for m in read_metrics(run / "metrics.jsonl") if (t := m.get("perf/trainer_threads"))]
    if threads:
        torch.set_num_threads(threads[0])  # the run's trainer's own count: float sums depend on it
    cfg.trainer = replace(cfg.trainer, backend="in_process", num_workers=1)
    saved = {int(p.name.split("_")[1]): p / "model" for p in (run / "checkpoints").glob("step_*")}
    compared: list[int] = []
    fingerprinted: list[int] = []
    first_diff: tuple[int, str] | None = None
    with start_roles(cfg, RolloutSide.ACTOR, specs_for(cfg), cls.roles_needed(cfg)) as roles:  # the run's trainer
        algorithm = cls(cfg, load_tokenizer_from(cfg.model.path), roles)
        for step, path in zip(steps, recorded):
            samples = pickle.loads(path.read_bytes())
            algorithm.train(algorithm.prepare(samples, step)(), step)
            fp_path = path.with_name(f"step_{step}.weights.json")
            has_ckpt = step in saved and (saved[step] / "config.json").is_file()
            if first_diff is not None or not (fp_path.is_file() or has_ckpt):
                continue
            mine = roles.trainer.state_dict().result()  # once per step, for both comparisons
            if fp_path.is_file():  # the run's own weights after this step, per tensor
                theirs = json.loads(fp_path.read_text())
                mine_fp = fingerprint(mine)
                fingerprinted.append(step)
                bad = [k for k in sorted(theirs) if k in mine_fp and mine_fp[k] != theirs[k]]
                if bad:
                    first_diff = (step, f"{bad[0]} (and {len(bad) - 1} more tensors)")
            if has_ckpt and first_diff is None:
                diff = _first_difference(mine, load_tensors(saved[step]))
                compared.append(step)
                if diff is not None:
                    first_diff = (step, diff)
        mine = roles.trainer.state_dict().result()
    final = _first_difference(mine, load_tensors(run / "final")) if (run / "final").is_dir() else "no final/ to compare"
    identical = first_diff is None and final is None
    if identical:
        line = f"replay: {len(steps)} steps; final weights identical to the run's, bit for bit"
    elif first_diff is not None:
        line = f"replay: {len(steps)} steps; first difference at step {first_diff[0]}: {first_diff[1]}"
    else:
        line = f"replay: {len(steps)} steps; final weights differ: {final}"
    return {
        "steps": len(steps),
        "checkpoints_compared": compared,
        "steps_fingerprinted": fingerprinted,
        "identical": identical,
        "line": line,
    }
