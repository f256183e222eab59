"""What every schedule shares: the run directory, data, metrics, evaluation, checkpoints, and the version counter.

The order of events belongs to each schedule's own module; this one only provides the parts. The trainer's weight
version is read, never counted here: from the checkpoint a run resumes from and from each update's result.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import yaml

from asyncrl import seeds
from asyncrl.algorithms import Algorithm, Prepared, Trained, algorithm_class
from asyncrl.checkpoint import CheckpointManager, load_driver_state, set_rng_state
from asyncrl.comm.transport import transport_of
from asyncrl.config import Config, to_dict
from asyncrl.config.specs import TrainerPlan, role_specs
from asyncrl.data.collate import TrainBatch
from asyncrl.data.dataset import PromptDataset, load_rows
from asyncrl.data.sampler import EpochSampler
from asyncrl.models.loading import check_model_dir
from asyncrl.models.loading import load_tokenizer_from as load_tokenizer
from asyncrl.rewards.overlong import overlong_metrics
from asyncrl.rewards.reward_fn import build_reward_fn
from asyncrl.roles.clients import RoleClient
from asyncrl.roles.team import Roles, RolloutSide
from asyncrl.rollout.agent.loop import check_agent_loop
from asyncrl.rollout.agent.tools import tool_schemas
from asyncrl.rollout.engine import SamplingParams
from asyncrl.schedules import held_out, replay
from asyncrl.schedules.step import StepTimer
from asyncrl.supervision.supervisor import RolloutPool
from asyncrl.telemetry import trace
from asyncrl.telemetry.metrics import MetricsLogger, machine_cpu, read_metrics
from asyncrl.telemetry.samples import sample_metrics
from asyncrl.telemetry.timeline import get_timeline, read_chrome_trace, write_chrome_trace
from asyncrl.types import Prompt, Sample
from asyncrl.weights.weight_sync import WeightSync
from asyncrl.workers.start import start_roles


class Run:
    """One training run's driver-side state: data cursor, logger, checkpoints, counters, the trainer's version."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.dir = Path(cfg.trainer.default_local_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        check_model_dir(cfg.model.path)  # before any worker starts: the workers load the weights
        check_agent_loop(cfg.rollout.agent.default_agent_loop)
        self.tokenizer = load_tokenizer(cfg.model.path)
        d = cfg.data
        tools = tool_schemas(cfg.rollout.multi_turn.tools)  # rendered into prompts by templates that know them
        self.train = PromptDataset(
            load_rows(d.train_files), self.tokenizer, d.max_prompt_length, overlong=d.overlong_prompts, tools=tools
        )
        self.val: PromptDataset | None = None
        if d.val_files:
            rows = load_rows(d.val_files)
            if d.val_max_samples > 0:
                rows = rows[: d.val_max_samples]
            self.val = PromptDataset(
                rows, self.tokenizer, d.max_prompt_length, overlong=d.overlong_prompts, tools=tools
            )
        # prompts drawn per generation call: a step's batch, or with dynamic sampling one of its generation batches
        self.sampler = EpochSampler(len(self.train), d.prompts_per_generation, seed=cfg.trainer.seed, shuffle=d.shuffle)
        self.reward_fn = build_reward_fn(cfg.reward.custom_function, binarize=cfg.reward.binarize)  # evaluation
        self.version = 0  # the trainer's weight version, as it last reported it
        self.consumed_version = 0
        self.ckpt = CheckpointManager(self.dir, cfg.trainer.max_checkpoints_to_keep)
        self.start_step = 1
        self.resumed_from: Path | None = None  # the checkpoint this run resumed from
        self.samples_trained = 0
        self.wall_offset_s = 0.0  # wall seconds spent before the last resume
        self.t0 = time.time()
        self.summary: dict[str, Any] = {}
        self.logger: MetricsLogger | None = None
        # who replaces a dead rollout worker: the rollout pool's supervisor (Ray runs with a pool, from the weight
        # sync's start) or fully_async's stream supervisor
        self.pool: RolloutPool | None = None
        self.stream: Any = None
        self.weight_sync: WeightSync | None = None
        (self.dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))

    # ---- data ----------------------------------------------------------------------------------------------------
    def next_prompts(self) -> list[Prompt]:
        """The next generation batch's prompts (``data.gen_batch_size``, or ``data.train_batch_size``) from the one
        stream whose cursor a checkpoint records."""
        out = []
        for epoch, index in self.sampler.next_batch():
            p = self.train[index]
            out.append(Prompt(**{**asdict(p), "epoch": epoch}))
        return out

    def sampling(self) -> SamplingParams:
        return SamplingParams.from_config(self.cfg.rollout)

    def gen_seed(self) -> int:
        """The base of every row's sampling noise (``seeds.row_keys``): a row's tokens depend on trainer.seed, its
        prompt's epoch and index and its number in the group, not on the step, so a resumed run samples what the
        unbroken run did and every schedule samples what sync does."""
        return seeds.sampling(self.cfg.trainer.seed)

    # ---- metrics ---------------------------------------------------------------------------------------------------

    def learn(self, algorithm: Algorithm, prepared: Prepared, step: int) -> Trained:
        """The algorithm's updates for one step; the trainer's new version is read from its result."""
        self.consumed_version = self.version  # the version the update consumes the samples at (the trace's)
        if self.cfg.trainer.record_consumed:  # what the trainer consumed, for asyncrl replay
            replay.record(self.dir, step, prepared.samples)
        trained = algorithm.train(prepared, step)
        if trained.actor is not None:
            self.version = trained.actor.version
            if trained.actor.fingerprint is not None:
                replay.record_fingerprint(self.dir, step, trained.actor.fingerprint)
        self.samples_trained += len(prepared.samples)
        return trained

    def start_weight_sync(self, roles: Roles) -> WeightSync:
        """Create the sync group and bring the rollout side to the trainer's weights (after a resume: the
        checkpoint's)."""
        ready = self.cfg.trainer.role_start_timeout_s
        backend = transport_of([h.location(ready) for h in [roles.trainer.handle, *roles.receivers]])
        ws = WeightSync(roles.trainer.handle, roles.receivers, self.cfg.weight_sync, ready, backend=backend)
        ws.setup()
        self.weight_sync = ws  # the last step's evaluation syncs the rollout pool to the final weights
        roles.rendezvous["weight_sync"] = ws.endpoint or ""
        self.summary.update(ws.summary())
        ws.push(self.version)
        if roles.respawn is not None and roles.rollouter is None:  # fully_async: StreamSupervisor
            t = self.cfg.trainer
            self.pool = RolloutPool(
                roles,
                ws,
                roles.respawn,
                lambda: self.version,
                t.max_worker_restarts,
                self.cfg.rollout.generate_timeout_s,
            )
        return ws

    def save_before_failing(
        self, step: int, roles: Roles, sampler_state: dict | None, extra_files: dict[str, Any] | None = None
    ) -> None:
        """A checkpoint of the last finished ``step`` before the run stops on an error (none before the first step,
        none again for a step that has one), so ``resume_mode=auto`` loses nothing."""
        if step >= self.start_step and not (self.ckpt.root / f"step_{step}").exists():
            self.save(step, roles.checkpointed, sampler_state, extra_files)

    def step_metrics(self, samples: list[Sample], batch: TrainBatch, tm: StepTimer, *parts: dict) -> dict[str, float]:
        """Everything logged for a step: sample statistics, the given parts, timings and throughput (the driver's
        ``timing_s/step`` must be set)."""
        step_s = tm.timings["timing_s/step"]
        metrics = {**sample_metrics(samples, batch), **overlong_metrics(samples)}
        metrics.update({**{k: v for p in parts for k, v in p.items()}, **tm.timings})
        metrics["perf/throughput_tokens_per_s"] = float(batch.attention_mask_BL.sum()) / step_s
        metrics["perf/samples_per_s"] = len(samples) / step_s
        metrics.update(machine_cpu())
        trace.append_work(self.dir, trace.work_record(tm.step, samples))
        t = self.cfg.rollout.trace
        if t.enable:  # a few of the step's samples, as consumed, in rollout_trace.jsonl
            recs = trace.records(
                tm.step, samples, self.consumed_version, self.tokenizer, t.max_samples_per_step, t.token2text
            )
            trace.append(self.dir, recs)
        return metrics

    # ---- evaluation ------------------------------------------------------------------------------------------------
    def due(self, freq: int, step: int) -> bool:
        """Whether something done every ``freq`` steps (``trainer.test_freq``/``save_freq``; 0 = never) happens at
        ``step``: on multiples of ``freq``, and always at the last step."""
        return (freq > 0 and step % freq == 0) or step == self.cfg.trainer.total_training_steps

    def evaluate(self, roles: Roles, step: int) -> dict[str, float]:
        """Held-out accuracy (``asyncrl.schedules.held_out``)."""
        return held_out.evaluate(self, roles, step)

    def evaluate_before_training(self, roles: Roles) -> None:
        """``accuracy_before`` (logged as step 0) once per run: a resumed run already has it in its summary."""
        if "accuracy_before" in self.summary or self.val is None or not self.cfg.trainer.val_before_train:
            return
        acc = self.evaluate(roles, step=0)
        self.summary["accuracy_before"] = acc["val/accuracy"]
        self.log(0, acc)

    # ---- logging ---------------------------------------------------------------------------------------------------
    def open_logger(self) -> MetricsLogger:
        t = self.cfg.trainer
        self.logger = MetricsLogger(self.dir, t.logger, run_name=self.dir.name, prometheus_port=t.prometheus_port)
        self.logger.set_total(t.total_training_steps)
        return self.logger

    def log(self, step: int, metrics: dict[str, float]) -> None:
        assert self.logger is not None
        self.logger.log(step, metrics)

    def end_step(
        self,
        step: int,
        metrics: dict[str, float],
        roles: Roles,
        sampler_state: dict | None = None,
        extra_files: dict[str, Any] | None = None,
    ) -> None:
        """Every schedule's step ends the same way: (held-out eval) -> log -> (checkpoint)."""
        if self.due(self.cfg.trainer.test_freq, step):
            metrics.update(self.evaluate(roles, step))
        self.log(step, metrics)
        if self.due(self.cfg.trainer.save_freq, step):
            self.save(step, roles.checkpointed, sampler_state, extra_files)

    def wall_s(self) -> float:
        return self.wall_offset_s + time.time() - self.t0

    # ---- checkpoints -----------------------------------------------------------------------------------------------
    def save(
        self,
        step: int,
        workers: dict[str, RoleClient],
        sampler_state: dict | None = None,
        extra_files: dict[str, Any] | None = None,
    ) -> Path:
        """Checkpoint at ``step``. ``sampler_state``: the data cursor to record when it differs from the live one
        (a schedule with a batch in flight records the cursor from before that batch was drawn, so it is not lost).
        ``extra_files``: file name -> object, written with ``torch.save`` inside the same atomic checkpoint."""

        def write(tmp: Path) -> None:
            for pending in [w.save_checkpoint(str(tmp)) for w in workers.values()]:
                pending.result()
            for name, obj in (extra_files or {}).items():
                torch.save(obj, tmp / name)

        state = {
            "sampler": sampler_state or self.sampler.state_dict(),
            "samples_trained": self.samples_trained,
            "wall_s": self.wall_s(),
            "summary": self.summary,
        }
        with get_timeline().span("checkpoint", step=step, worker="driver"):
            return self.ckpt.save(step, write, state)

    def maybe_resume(self, workers: dict[str, RoleClient]) -> int:
        """Restore from the latest (``auto``) or the given checkpoint; returns the first step still to run.

        Metrics logged after the checkpoint's step (by a run that died before its next checkpoint) are dropped from
        ``metrics.jsonl``, so each step appears exactly once after the resumed run logs it again.
        """
        mode = self.cfg.trainer.resume_mode
        ckpt = None if mode == "disable" else self.ckpt.latest() if mode == "auto" else Path(mode)
        if ckpt is None:  # a fresh run: metrics an earlier run left in this directory must not mix with its own
            self._truncate_metrics(0)
            return 1
        state = load_driver_state(ckpt)
        loaded = {name: w.load_checkpoint(str(ckpt)) for name, w in workers.items()}
        self.version = int(loaded["actor"].result())
        for pending in loaded.values():
            pending.result()
        self.sampler.load_state_dict(state["sampler"])
        self.samples_trained = int(state["samples_trained"])
        self.wall_offset_s = float(state["wall_s"])
        self.summary = dict(state.get("summary", {}))
        set_rng_state(state["rng"])
        step = int(state["step"])
        self._truncate_metrics(step)
        self.start_step = step + 1
        self.resumed_from = ckpt
        total = self.cfg.trainer.total_training_steps
        todo = f"steps {step + 1}..{total} to run" if step < total else "no step left to run"
        print(f"[{self.dir.name}] resumed from {ckpt} (step {step}, {self.samples_trained} samples trained); {todo}")
        return self.start_step

    def _truncate_metrics(self, last_step: int) -> None:
        trace.truncate(self.dir, last_step)
        replay.truncate(self.dir, last_step)
        path = self.dir / "metrics.jsonl"
        if not path.exists():
            return
        keep = [m for m in read_metrics(path) if int(m.get("step", 0)) <= last_step] if last_step > 0 else []
        tmp = path.with_name("metrics.jsonl.tmp")
        tmp.write_text("".join(json.dumps(m) + "\n" for m in keep))
        tmp.replace(path)

    def last_val_accuracy(self) -> float | None:
        vals = [
            m["val/accuracy"] for m in read_metrics(self.dir / "metrics.jsonl") if m.get("val/accuracy") is not None
        ]
        return vals[-1] if vals else None

    # ---- the end ---------------------------------------------------------------------------------------------------
    def finish(self, roles: Roles, step: int) -> dict[str, Any]:
        """``accuracy_after``, the final model, ``summary.json`` and the merged timeline of every role."""
        last = self.last_val_accuracy()
        if last is not None:
            self.summary["accuracy_after"] = last
        extra_events = roles.timelines()
        final = self.dir / "final"
        roles.trainer.export_model(str(final)).result()
        self.summary.update(
            steps=step, samples=self.samples_trained, wall_s=round(self.wall_s(), 2), final_model=str(final)
        )
        supervisor = self.pool or self.stream
        if supervisor is not None:  # every rollout worker replaced in this run, and why
            self.summary["worker_restarts"] = [f"{worker}: {cause}" for worker, cause in supervisor.restarts]
        (self.dir / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")
        events = get_timeline().drain() + extra_events
        trace = self.dir / "timeline.json"
        if self.start_step > 1 and trace.exists():  # resumed: keep the spans of the runs before
            events = read_chrome_trace(trace) + events
        write_chrome_trace(trace, events)
        if self.logger is not None:
            self.logger.close()
        return self.summary


@contextmanager
def _driver_threads(cfg: Config) -> Iterator[None]:
    """With the Ray backend the driver only keeps books (collate, advantages) beside workers that use every core:
    one torch thread, so its OpenMP pool does not wake a second thread on (and spin on) a core a worker is using."""
    if cfg.trainer.backend != "ray":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def open_run(
    cfg: Config, side: RolloutSide, plan: TrainerPlan, producer: type | None = None
) -> Iterator[tuple[Run, Algorithm, Roles]]:
    """What comes before every schedule's first step: the run directory and data, the algorithm's own resources (a
    teacher), every role started on its pool with its spec (``plan``: what the schedule decided for the trainer;
    ``producer``: the worker class of a streaming schedule's producer), a resume from the latest checkpoint, the
    logger, and the held-out accuracy before training. Everything started here is stopped at exit."""
    run = Run(cfg)
    cls = algorithm_class(cfg)
    specs = role_specs(cfg, cls.trainer_needs(cfg), plan)
    with (
        _driver_threads(cfg),
        cls.resources(cfg, run.tokenizer, str(run.dir)) as resources,
        start_roles(cfg, side, specs, cls.roles_needed(cfg), producer) as roles,
    ):
        algorithm = cls(cfg, run.tokenizer, roles, resources)
        start = run.maybe_resume(roles.checkpointed)
        algorithm.on_resume(start)
        run.summary.update(algorithm.summary)
        run.summary["placement"] = {
            "pools": {name: asdict(pool) for name, pool in roles.placement.all_pools().items()},
            "roles": roles.placement.roles,
            "workers": [asdict(w) for w in roles.locations(cfg.trainer.role_start_timeout_s)],
            "rendezvous": roles.rendezvous,
        }
        run.open_logger()
        run.evaluate_before_training(roles)
        yield run, algorithm, roles
