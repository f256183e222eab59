"""Where a step's batch comes from on the batch schedules (sync, one_step_off, two_step_off): the run's one prompt
stream (``PromptStream``), the generation of its prompts on the rollout side (``launch_generation``) and dynamic
sampling's filling (``BatchFiller``; the feature and its metrics: docs/rewards.md, "DAPO").

With a ``RolloutPool`` (``asyncrl.run.supervision``), a worker that dies or hangs while generating its share is
replaced and the share generated again on the new worker, same prompts and seed. Every generation batch, its groups
kept or not, draws from the one stream (``PromptStream.next_prompts``); each schedule records for a checkpoint the
cursor after the last generation batch of the step it trained (or of the batch in flight, for the pipelined ones).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from asyncrl import seeds
from asyncrl.calls import Pending
from asyncrl.config import Config
from asyncrl.data.dataset import EpochSampler, PromptDataset, load_rows
from asyncrl.errors import UserInputError
from asyncrl.rewards.filtering import filter_groups, group_by_prompt
from asyncrl.roles.clients import RolloutClient
from asyncrl.rollout.agent.tools import tool_schemas
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.run.supervision import RolloutPool
from asyncrl.telemetry.metrics import merge_metrics
from asyncrl.types import Generation, PrefillStats, Prompt, Sample


class PromptStream:
    """The run's data: ``train`` (drawn from by ``next_prompts``, the one cursor a checkpoint records), ``val`` (the
    held-out prompts, ``data.val_max_samples`` of them; None without ``data.val_files``) and how rows are sampled."""

    def __init__(self, cfg: Config, tokenizer: object):
        self.cfg = cfg
        d = cfg.data
        tools = tool_schemas(cfg.rollout.multi_turn.tools)  # rendered into prompts by templates that know them
        self.train = PromptDataset(
            load_rows(d.train_files), tokenizer, d.max_prompt_length, overlong=d.overlong_prompts, tools=tools
        )
        self.val: PromptDataset | None = None
        if d.val_files:
            rows = load_rows(d.val_files)
            if d.val_max_samples > 0:
                rows = rows[: d.val_max_samples]
            self.val = PromptDataset(rows, tokenizer, d.max_prompt_length, overlong=d.overlong_prompts, tools=tools)
        # prompts drawn per generation call: a step's batch, or with dynamic sampling one of its generation batches
        self.sampler = EpochSampler(len(self.train), d.prompts_per_generation, seed=cfg.trainer.seed, shuffle=d.shuffle)

    def next_prompts(self) -> list[Prompt]:
        """The next generation batch's prompts (``data.gen_batch_size``, or ``data.train_batch_size``)."""
        return [self.train.get(index, epoch) for epoch, index in self.sampler.next_batch()]

    def sampling(self) -> SamplingParams:
        return SamplingParams.from_config(self.cfg.rollout)

    def gen_seed(self) -> int:
        """The base of every row's sampling noise (``rollout.sampling.row_keys``): a row's tokens depend on
        trainer.seed, its prompt's epoch and index and its number in the group, not on the step, so a resumed run
        samples what the unbroken run did and every schedule samples what sync does."""
        return seeds.sampling(self.cfg.trainer.seed)


@dataclass
class Generated:
    """A generated batch: its samples in prompt order per worker, the slowest worker's seconds, and what the
    rollout engines reported (metrics: docs/metrics.md, "Time and throughput")."""

    samples: list[Sample]
    seconds: float
    metrics: dict[str, float]


@dataclass
class Launched:
    """A batch being generated on the rollout side (not waited for yet)."""

    calls: list[Pending[Generation]]
    pool: RolloutPool | None = None  # replaces a worker that dies and generates its share again
    workers: list[int] = field(default_factory=list)  # the rollout worker of each call
    again: list[Callable[[RolloutClient], Pending[Generation]]] = field(default_factory=list)  # each call, re-issued

    def result(self) -> Generated:
        if self.pool is None:
            gens = [c.result() for c in self.calls]
        else:
            gens = [self.pool.wait(i, c, redo) for i, c, redo in zip(self.workers, self.calls, self.again)]
        prefill = sum((g.prefill for g in gens), PrefillStats())
        samples, seconds = [s for g in gens for s in g.samples], max(g.seconds for g in gens)
        rate = {"perf/rollout_tokens_per_s": sum(len(s.response_ids) for s in samples) / seconds} if seconds > 0 else {}
        rewards = merge_metrics([g.reward_metrics for g in gens])
        return Generated(samples, seconds, {**prefill.metrics(), **rate, **rewards})


def launch_generation(
    rollouts: list[RolloutClient],
    prompts: list[Prompt],
    params: SamplingParams,
    seed: int,
    step: int,
    pool: RolloutPool | None = None,
) -> Launched:
    """Split ``prompts`` over the rollout side (whole prompts: a group stays on one worker); not waited for."""
    k = len(rollouts)
    chunks = [prompts[i::k] for i in range(k)]
    workers = [i for i in range(k) if chunks[i]]
    # each worker's call, to issue again on a replacement; rows key their own noise (sampling.row_keys)
    again = [lambda w, chunk=chunks[i]: w.generate(chunk, params, seed, step) for i in workers]
    return Launched([redo(rollouts[i]) for i, redo in zip(workers, again)], pool, workers, again)


@dataclass
class Replayed:
    """A batch read back from a dump (``asyncrl.run.skip``), not generated."""

    samples: list[Sample]

    def result(self) -> Generated:
        return Generated(self.samples, 0.0, {"rollout/skipped": 1.0})


# the ``g``-th generation batch of a step (g = 2, 3, ...), launched: a schedule's own launch, bound to the step
LaunchMore = Callable[[int], Launched | Replayed]


class DynamicSamplingError(UserInputError, RuntimeError):
    """``algorithm.filter_groups.max_num_gen_batches`` generation batches did not fill a step's batch."""


class BatchFiller:
    """Fills a step's batch with groups that have a spread (``algorithm.filter_groups``); with it off, a step's
    batch is its one generation batch."""

    def __init__(self, cfg: Config):
        fg = cfg.algorithm.filter_groups
        self.enable, self.metric, self.max_gen_batches = fg.enable, fg.metric, fg.max_num_gen_batches
        self.groups_per_step = cfg.data.train_batch_size

    def fill(self, step: int, first: Launched | Replayed, launch_more: LaunchMore) -> Generated:
        """Wait for ``first`` (the step's first generation batch) and, with filtering on, judge its groups and
        launch and wait for more (``launch_more(g)``) until ``data.train_batch_size`` groups are kept. The result's
        samples are the first ``train_batch_size`` kept groups in generation order; its seconds add up the
        generation batches' (they ran one after another)."""
        if not self.enable:
            return first.result()
        gens: list[Generated] = []
        kept: list[list] = []
        generated = filtered = 0
        pending = first
        while True:
            gen = pending.result()
            gens.append(gen)
            groups = group_by_prompt(gen.samples)
            keep, dropped = filter_groups(groups, self.metric)
            kept += keep
            generated, filtered = generated + len(groups), filtered + dropped
            if len(kept) >= self.groups_per_step:
                break
            if 0 < self.max_gen_batches <= len(gens):
                raise DynamicSamplingError(
                    f"algorithm.filter_groups.max_num_gen_batches={self.max_gen_batches}: step {step} generated "
                    f"{len(gens)} generation batches ({generated} groups) and only {len(kept)} "
                    f"groups had a spread of algorithm.filter_groups.metric={self.metric!r}, of the "
                    f"{self.groups_per_step} data.train_batch_size needs; {filtered} had the same {self.metric} in "
                    "every sample (the prompts may be too easy or too hard for the model); raise "
                    "max_num_gen_batches, or set it to 0 for no limit"
                )
            pending = launch_more(len(gens) + 1)
        trained = kept[: self.groups_per_step]
        metrics = {
            **merge_metrics([g.metrics for g in gens]),
            "train/num_gen_batches": float(len(gens)),
            "dynamic_sampling/groups_generated": float(generated),
            "dynamic_sampling/groups_kept": float(len(kept)),
            "dynamic_sampling/groups_filtered": float(filtered),
            "dynamic_sampling/groups_discarded": float(len(kept) - len(trained)),
            "dynamic_sampling/groups_trained": float(len(trained)),
        }
        return Generated([s for g in trained for s in g], sum(g.seconds for g in gens), metrics)
