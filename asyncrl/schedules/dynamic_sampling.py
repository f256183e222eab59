"""Dynamic sampling on the batch schedules (sync, one_step_off, two_step_off): ``algorithm.filter_groups``.

DAPO's loop, as verl's DAPO trainer runs it. A step's batch is generated in generation batches of
``data.gen_batch_size`` prompts (``data.train_batch_size`` when null). Each one's groups are judged by the rule in
``asyncrl.rewards.filtering`` (``keep_group``: the metric differs within the group); while fewer than
``data.train_batch_size`` groups are kept, another generation batch is generated and judged, at most
``max_num_gen_batches`` of them (0: no limit), after which the run stops with an error naming the key and the
counts. The groups kept beyond a full batch in the last generation batch are discarded, as verl discards them.

Where this departs from verl: the extra generation batches of a step are generated with the weights its first one
was (no weight sync in between), and the surplus is never carried into the next step, so every schedule keeps its
exact staleness (sync 0, one_step_off 1, two_step_off 2) with filtering on.

The data cursor: each generation batch draws from the run's one prompt stream (``Run.next_prompts``), so the
prompts of filtered and discarded groups are consumed, as in verl. Each schedule records, for a checkpoint, the
cursor after the last generation batch of the step it trained (or of the batch in flight, for the pipelined ones),
so a resumed run goes on with the prompt after the last one drawn.

Metrics of a step: ``train/num_gen_batches`` (verl's name) and ``dynamic_sampling/groups_generated``,
``groups_kept`` (with a spread), ``groups_filtered`` (without: dropped), ``groups_discarded`` (kept beyond the full
batch) and ``groups_trained``; generated = kept + filtered and kept = trained + discarded, trained =
``data.train_batch_size``.
"""

from __future__ import annotations

from collections.abc import Callable

from asyncrl.config import Config
from asyncrl.errors import UserInputError
from asyncrl.rewards.filtering import filter_groups, group_by_prompt
from asyncrl.rewards.loop import merge_metrics
from asyncrl.schedules.generation import Generated, Launched
from asyncrl.schedules.skip import Replayed

# the ``g``-th generation batch of a step (g = 2, 3, ...), launched: a schedule's own launch, bound to the step
LaunchMore = Callable[[int], Launched | Replayed]


class DynamicSamplingError(UserInputError, RuntimeError):
    """``algorithm.filter_groups.max_num_gen_batches`` generation batches did not fill a step's batch."""


class BatchFiller:
    """Fills a step's batch with groups that have a spread (``algorithm.filter_groups``); with it off, a step's
    batch is its one generation batch, as before."""

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
