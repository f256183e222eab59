"""The run directory: its config, checkpoints and the resume from one, the records ``asyncrl replay`` reads, and what
a run leaves at its end (``summary.json``, the merged ``timeline.json``, the final model). Layout: docs/outputs.md.
"""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from asyncrl.checkpoint import CheckpointManager, atomic_write_bytes, load_driver_state, set_rng_state
from asyncrl.config import Config, to_dict
from asyncrl.roles.clients import RoleClient
from asyncrl.telemetry import trace
from asyncrl.telemetry.metrics import read_metrics
from asyncrl.telemetry.timeline import get_timeline, read_chrome_trace, write_chrome_trace
from asyncrl.types import Sample

CONSUMED_DIR = "consumed"  # trainer.record_consumed: what each step's update consumed, for asyncrl replay


@dataclass
class Progress:
    """How far the run is: the first step this process runs (after a resume: the one after the checkpoint's), the
    trainer's weight version as it last reported it (read, never counted here), the version the last update
    consumed its samples at, and the samples trained so far."""

    start_step: int = 1
    version: int = 0
    consumed_version: int = 0
    samples_trained: int = 0


def step_of(path: Path) -> int:
    """N of ``step_N.pkl`` / ``step_N.weights.json``."""
    return int(path.name.split(".")[0].removeprefix("step_"))


class RunDir:
    """``trainer.default_local_dir`` and what is written there; ``summary``: what ``summary.json`` will hold."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.path = Path(cfg.trainer.default_local_dir)
        self.path.mkdir(parents=True, exist_ok=True)
        self.ckpt = CheckpointManager(self.path, cfg.trainer.max_checkpoints_to_keep)
        self.summary: dict[str, Any] = {}
        self.resumed_from: Path | None = None  # the checkpoint this run resumed from
        self.wall_offset_s = 0.0  # wall seconds spent before the last resume
        self.t0 = time.time()
        get_timeline().drain()  # spans a run in this process left when it raised before write_end are not this run's
        (self.path / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))

    def wall_s(self) -> float:
        return self.wall_offset_s + time.time() - self.t0

    # ---- checkpoints -----------------------------------------------------------------------------------------------
    def save(
        self,
        step: int,
        workers: dict[str, RoleClient],
        progress: Progress,
        sampler_state: dict,
        extra_files: Mapping[str, object] | None = None,
    ) -> Path:
        """Checkpoint at ``step``: every worker's state, ``sampler_state`` (the data cursor a resumed run starts
        from) and ``extra_files`` (file name -> object, written with ``torch.save`` inside the same atomic
        checkpoint)."""

        def write(tmp: Path) -> None:
            for pending in [w.save_checkpoint(str(tmp)) for w in workers.values()]:
                pending.result()
            for name, obj in (extra_files or {}).items():
                torch.save(obj, tmp / name)

        state = {
            "sampler": sampler_state,
            "samples_trained": progress.samples_trained,
            "wall_s": self.wall_s(),
            "summary": self.summary,
        }
        with get_timeline().span("checkpoint", step=step, worker="driver"):
            return self.ckpt.save(step, write, state)

    def has_checkpoint(self, step: int) -> bool:
        return (self.ckpt.root / f"step_{step}").exists()

    def resume(self, workers: dict[str, RoleClient]) -> tuple[Progress, dict | None]:
        """Restore the workers from the latest (``auto``) or the given checkpoint; the run's progress and the data
        cursor to go on from (None: a fresh run).

        Metrics and records logged after the checkpoint's step (by a run that died before its next checkpoint) are
        dropped, so each step appears exactly once after the resumed run logs it again.
        """
        mode = self.cfg.trainer.resume_mode
        ckpt = None if mode == "disable" else self.ckpt.latest() if mode == "auto" else Path(mode)
        if ckpt is None:  # a fresh run: metrics an earlier run left in this directory must not mix with its own
            self._truncate(0)
            return Progress(), None
        state = load_driver_state(ckpt)
        loaded = {name: w.load_checkpoint(str(ckpt)) for name, w in workers.items()}
        version = loaded["actor"].result()
        if version is None:
            raise RuntimeError(f"{ckpt}: the actor's checkpoint holds no weight version")
        for pending in loaded.values():
            pending.result()
        self.wall_offset_s = float(state["wall_s"])
        self.summary = dict(state.get("summary", {}))
        set_rng_state(state["rng"])
        step = int(state["step"])
        self._truncate(step)
        self.resumed_from = ckpt
        progress = Progress(start_step=step + 1, version=version, samples_trained=int(state["samples_trained"]))
        total = self.cfg.trainer.total_training_steps
        todo = f"steps {step + 1}..{total} to run" if step < total else "no step left to run"
        print(
            f"[{self.path.name}] resumed from {ckpt} (step {step}, {progress.samples_trained} samples trained); {todo}"
        )
        return progress, state["sampler"]

    def _truncate(self, last_step: int) -> None:
        trace.truncate(self.path, last_step)
        for p in (self.path / CONSUMED_DIR).glob("step_*"):  # a resumed run records them again
            if step_of(p) > last_step:
                p.unlink()
        path = self.path / "metrics.jsonl"
        if not path.exists():
            return
        keep = [m for m in read_metrics(path) if int(m.get("step") or 0) <= last_step] if last_step > 0 else []
        atomic_write_bytes(path, "".join(json.dumps(m) + "\n" for m in keep).encode())

    # ---- what asyncrl replay reads (trainer.record_consumed) -------------------------------------------------------
    def record_consumed(self, step: int, samples: list[Sample]) -> None:
        (self.path / CONSUMED_DIR).mkdir(exist_ok=True)
        atomic_write_bytes(self.path / CONSUMED_DIR / f"step_{step}.pkl", pickle.dumps(samples))

    def record_fingerprint(self, step: int, fp: dict[str, int]) -> None:
        atomic_write_bytes(self.path / CONSUMED_DIR / f"step_{step}.weights.json", json.dumps(fp).encode())

    # ---- the end ---------------------------------------------------------------------------------------------------
    def last_val_accuracy(self) -> float | None:
        vals = [
            m["val/accuracy"] for m in read_metrics(self.path / "metrics.jsonl") if m.get("val/accuracy") is not None
        ]
        return vals[-1] if vals else None

    def write_end(self, extra_events: Iterable[Mapping[str, object]], resumed: bool) -> dict[str, Any]:
        """``summary.json`` and ``timeline.json`` (the driver's spans with ``extra_events``, the roles'; after a
        resume, the spans of the runs before kept)."""
        (self.path / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")
        driver = get_timeline()
        driver.extend(extra_events)  # the roles' spans, checked and completed as events
        events = driver.drain()
        timeline = self.path / "timeline.json"
        if resumed and timeline.exists():
            events = read_chrome_trace(timeline) + events
        write_chrome_trace(timeline, events)
        return self.summary
