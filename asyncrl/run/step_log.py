"""What a step measures and where it is written: its wall-clock timings (``StepTimer``), the staleness of what it
trained, its samples' statistics (rewards, lengths, and the agent loop's turns and tool calls) and throughput, and
the run's metrics log (``metrics.jsonl`` and the configured backends) with the work and rollout traces beside it."""

from __future__ import annotations

import shlex
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from asyncrl import losses
from asyncrl.config import Config, to_dict
from asyncrl.config.specs import RewardSpec
from asyncrl.data.collate import Prepared, TrainBatch, group_ids, rewards_of
from asyncrl.rewards.overlong import OverlongShaping, overlong_metrics
from asyncrl.telemetry import trace
from asyncrl.telemetry.metrics import MetricsLogger, machine_cpu
from asyncrl.telemetry.timeline import get_timeline
from asyncrl.telemetry.trackers import RunInfo
from asyncrl.types import Sample, Trained

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class TokenVersionError(RuntimeError):
    """A token's recorded version contradicts the books: older than its sample's start version (an engine decoded
    with weights older than those its row was admitted at), or past the staleness bound. Names the sample."""


def staleness_metrics(samples: list[Sample], trainer_version: int, bound: int | None = None) -> dict[str, float]:
    """Staleness of each sample = the trainer's version at the update that consumes it minus the version its
    generation started with; checked against the versions the engine recorded per token: none older than the start
    (``min(versions) >= start_version``) and, with ``bound``, ``trainer_version - min(versions) <= bound``. A bug in
    an engine's weights or versions raises ``TokenVersionError`` here, whatever the schedule's books say."""
    st, oldest = [], trainer_version
    for s in samples:
        first = min(s.versions, default=s.start_version)
        if first < s.start_version:
            raise TokenVersionError(
                f"sample {s.uid} row {s.row}: a token decoded at version {first}, before its start version "
                f"{s.start_version} (the engine decoded with weights older than the row was admitted at)"
            )
        if bound is not None and trainer_version - first > bound:
            raise TokenVersionError(
                f"sample {s.uid} row {s.row}: a token decoded at version {first} trained at version {trainer_version}: "
                f"staleness {trainer_version - first} > the bound {bound}"
            )
        st.append(trainer_version - s.start_version)
        oldest = min(oldest, first)
    return {
        "staleness/mean": sum(st) / len(st),
        "staleness/max": float(max(st)),
        "staleness/token_max": float(trainer_version - oldest),
    }


def sample_metrics(samples: list[Sample], batch: TrainBatch) -> dict[str, float]:
    """``reward/*``, ``response_length/*`` (tokens, tool outputs included), ``prompt_length/mean`` and, for
    multi-turn samples, ``agent/*`` (see ``agent_metrics``)."""
    rewards = rewards_of(samples)
    lens = batch.response_lengths().float()
    return {
        "reward/mean": float(rewards.mean()),
        "reward/max": float(rewards.max()),
        "reward/min": float(rewards.min()),
        "reward/failed_count": float(sum(s.reward_failed for s in samples)),
        # groups whose rewards differ: the only ones GRPO learns from
        "reward/group_spread_frac": losses.group_reward_spread(rewards, group_ids(samples)),
        "response_length/mean": float(lens.mean()),
        "response_length/max": float(lens.max()),
        "response_length/p95": float(torch.quantile(lens, 0.95)),
        "response_length/clip_ratio": float(sum(s.stop_reason == "length" for s in samples) / len(samples)),
        "prompt_length/mean": float(sum(len(s.prompt.prompt_ids) for s in samples) / len(samples)),
        **agent_metrics(samples),
    }


def agent_metrics(samples: list[Sample]) -> dict[str, float]:
    """Multi-turn metrics of a batch (docs/metrics.md, ``agent/*``); none when every sample is single-turn."""
    if not samples or all(s.response_mask is None for s in samples):
        return {}
    n = len(samples)
    tokens = sum(len(s.response_ids) for s in samples)
    tool_tokens = sum(len(s.response_mask) - sum(s.response_mask) for s in samples if s.response_mask is not None)
    return {
        "agent/turns_mean": sum(s.turns for s in samples) / n,
        "agent/tool_call_rate": sum(s.tool_calls > 0 for s in samples) / n,
        "agent/tool_calls_mean": sum(s.tool_calls for s in samples) / n,
        "agent/tool_error_count": float(sum(s.tool_errors for s in samples)),
        "agent/tool_token_frac": tool_tokens / max(tokens, 1),
    }


class StepTimer:
    """Collects ``timing_s/<name>`` wall-clock seconds for one step, and records each as a driver span."""

    def __init__(self, step: int):
        self.step = step
        self.timings: dict[str, float] = {}
        self.timeline = get_timeline()

    @contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        with self.timeline.span(name, step=self.step, worker="driver"):
            yield
        self.timings[f"timing_s/{name}"] = self.timings.get(f"timing_s/{name}", 0.0) + time.perf_counter() - t0


class StepLog(MetricsLogger):
    """The run's metrics log, opened on ``run_dir``, and how one step's metrics are made. ``placement`` (where the
    roles run) and the command line go to the experiment trackers with the config; ``resumed``: the run goes on
    from a checkpoint, so they continue the tracker runs they logged before."""

    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        tokenizer: PreTrainedTokenizerBase,
        placement: dict[str, object] | None = None,
        resumed: bool = False,
    ):
        t = cfg.trainer
        self.cfg, self.tokenizer = cfg, tokenizer
        shaping = OverlongShaping.of(RewardSpec.of(cfg))
        self.overlong_logged = shaping is not None and shaping.log  # overlong_buffer_cfg.log: its two step metrics
        run = RunInfo(
            project=t.project_name,
            name=t.experiment_name or run_dir.name,
            config=to_dict(cfg),
            command=shlex.join(sys.argv),
            placement=placement or {},
            resumed=resumed,
        )
        super().__init__(run_dir, t.logger, run_name=run_dir.name, prometheus_port=t.prometheus_port, run=run)
        self.set_total(t.total_training_steps)

    def metrics(
        self, prepared: Prepared, trained: Trained, tm: StepTimer, consumed_version: int, *parts: dict
    ) -> dict[str, float]:
        """A step's metrics (``Run.end_step`` lists them; the step's ``timing_s/step`` must be set) and throughput;
        the step's work record and (``rollout.trace``) a few of its samples, as consumed at ``consumed_version``,
        written beside the metrics."""
        samples, batch = prepared.samples, prepared.batch
        staleness = staleness_metrics(samples, consumed_version)
        step_s = tm.timings["timing_s/step"]
        metrics = {**sample_metrics(samples, batch), **(overlong_metrics(samples) if self.overlong_logged else {})}
        parts = (prepared.metrics, trained.metrics, staleness, *parts)
        metrics.update({**{k: v for p in parts for k, v in p.items()}, **tm.timings})
        metrics["perf/throughput_tokens_per_s"] = float(batch.attention_mask_BL.sum()) / step_s
        metrics["perf/samples_per_s"] = len(samples) / step_s
        metrics.update(machine_cpu())
        trace.append(self.out_dir / trace.WORK_FILE, [trace.work_record(tm.step, samples)])
        t = self.cfg.rollout.trace
        if t.enable:  # a few of the step's samples, as consumed, in rollout_trace.jsonl
            recs = trace.records(
                tm.step, samples, consumed_version, self.tokenizer, t.max_samples_per_step, t.token2text
            )
            trace.append(self.out_dir / trace.TRACE_FILE, recs)
        return metrics

    def due(self, freq: int, step: int) -> bool:
        """Whether something done every ``freq`` steps (``trainer.test_freq``/``save_freq``; 0 = never) happens at
        ``step``: on multiples of ``freq``, and always at the last step."""
        return (freq > 0 and step % freq == 0) or step == self.cfg.trainer.total_training_steps
