"""``distill``: on-policy distillation (GKD) of a student from a teacher server, under one of three schedulers.

The student generates on its own prompts, the teacher server returns its top-k log-probs for every position of
prompt + response, and the student minimises ``distill.loss`` against them (``asyncrl.algos.distill_loss``). The
teacher is any server speaking vLLM's ``/v1/completions`` with ``prompt_logprobs``: ``teacher.url``, or a
``asyncrl serve-teacher`` process started here on ``teacher.model_path`` and stopped at the end.

``trainer.scheduler`` picks the order of events (each below reads top to bottom):

- ``serial``: the baseline, nothing overlaps. One colocated worker generates with the current weights, then the
  teacher scores, then the student updates. Staleness 0.
- ``one_step_off``: a rollout pool generates batch t+1 while the teacher scores batch t and the trainer updates on
  it. Staleness 1.
- ``two_step_off``: batch t+2 is generated and batch t+1 scored by the teacher (in a driver thread) while the trainer
  updates on batch t. Staleness 2.

Timers: ``timing_s/wait_prev_gen``, ``timing_s/wait_prev_teacher`` (what the loop waited), ``timing_s/
get_teacher_knowledge`` (what the teacher calls took, overlapped or not), ``timing_s/sync_rollout_weights``,
``timing_s/update_actor``; metric ``actor/kl_loss``. Rewards are scored for the metrics only (``reward/mean`` is the
student's training accuracy); the loss is the teacher's. A checkpoint records the data cursor after the batch it
trained, so batches in flight are drawn, generated and scored again by a resumed run, neither lost nor repeated.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import ray
import torch

from asyncrl.algos.distill_loss import mix_on_policy
from asyncrl.config import Config
from asyncrl.data.collate import TrainBatch, collate
from asyncrl.distill.client import TeacherClient
from asyncrl.distill.knowledge import TeacherKnowledge, dataset_responses, get_teacher_knowledge
from asyncrl.distill.launch import teacher_endpoint
from asyncrl.pipelines.common import Run, StepTimer, gather_generation, launch_generation, staleness_metrics
from asyncrl.sync.ray_sync import setup_weight_sync, sync_weights
from asyncrl.telemetry.timeline import get_timeline
from asyncrl.types import Prompt, Sample
from asyncrl.workers.actor_worker import ActorRolloutWorker
from asyncrl.workers.cluster import init_ray, make_pools, release_pools
from asyncrl.workers.rollout_worker import RolloutWorker


def run_distill(cfg: Config) -> dict[str, Any]:
    run = Run(cfg)
    tc = cfg.teacher
    with teacher_endpoint(tc, run.dir) as url:
        client = TeacherClient(url, tc.top_k, tc.max_in_flight, tc.timeout_s, tc.max_retries, tc.backoff_s)
        try:
            run.summary["teacher"] = {"url": url, **client.check_compatible(run.tokenizer, tc.check_tokenizer)}
            init_ray(cfg.ray)
            r, t = cfg.rollout, cfg.trainer
            sizes = {"trainer": (1, t.cpus_per_worker)}
            if t.scheduler != "serial":
                sizes["rollout"] = (r.num_workers, r.cpus_per_worker)
            pools = make_pools(sizes)
            trainer = pools["trainer"].spawn(0, ActorRolloutWorker, cfg, name="trainer")
            rollouts = []
            if t.scheduler != "serial":
                rollouts = [
                    pools["rollout"].spawn(i, RolloutWorker, cfg, name=f"rollout{i}") for i in range(r.num_workers)
                ]
            try:
                return _Distill(cfg, run, client, trainer, rollouts).execute()
            finally:
                for actor in [trainer, *rollouts]:
                    ray.kill(actor)
                release_pools(pools)
        finally:
            client.close()


class _Distill:
    """The parts the three schedulers share; each scheduler is one method that reads as its loop."""

    def __init__(self, cfg: Config, run: Run, client: TeacherClient, trainer: Any, rollouts: list[Any]):
        self.cfg, self.run, self.client, self.trainer, self.rollouts = cfg, run, client, trainer, rollouts
        self.params = run.sampling()
        self.total = cfg.trainer.total_training_steps
        self.cursors: dict[int, dict] = {}  # batch b -> the data cursor right after batch b was drawn
        self.on_policy_gen = torch.Generator().manual_seed(cfg.trainer.seed)

    def execute(self) -> dict[str, Any]:
        run, cfg = self.run, self.cfg
        start = run.maybe_resume({"actor_rollout": self.trainer})
        self.cursors[start - 1] = run.sampler.state_dict()
        for _ in range(start - 1):  # one on/off-policy draw per batch: a resumed run continues the same sequence
            mix_on_policy(cfg.distill.lmbda, self.on_policy_gen)
        self.logger = run.open_logger()
        self.version = start - 1  # the trainer's weight version = updates applied so far
        if self.rollouts:
            s = cfg.sync
            plan = setup_weight_sync(self.trainer, self.rollouts, bucket_mb=s.bucket_mb, timeout_s=s.timeout_s)
            run.summary["sync_bytes"] = plan["bytes"]
            self.sync(StepTimer(start))  # after a resume: the rollout pool catches up
        run.evaluate_before_training(self.trainer)
        scheduler: Callable[[int], int] = getattr(self, cfg.trainer.scheduler)
        with ThreadPoolExecutor(1, thread_name_prefix="teacher") as self.teacher_pool:
            step = scheduler(start)
        last = run.last_val_accuracy()
        if last is not None:
            run.summary["accuracy_after"] = last
        events = ray.get(self.trainer.pop_timeline.remote())
        events += sum(ray.get([w.pop_timeline.remote() for w in self.rollouts]), [])
        return run.finish(self.trainer, step, events)

    # ---- the schedulers ----------------------------------------------------------------------------------------
    def serial(self, start: int) -> int:
        step = start - 1
        for step in range(start, self.total + 1):
            tm, t0 = StepTimer(step), time.perf_counter()
            prompts = self.draw(step)
            with tm("gen"):
                samples = ray.get(
                    self.trainer.generate.remote(prompts, self.params, seed=self.run.gen_seed(step), step=step)
                )
            samples, on_policy = self.mix(samples)
            with tm("get_teacher_knowledge"):
                knowledge = self.teacher(samples, step)
            self.train(step, samples, on_policy, knowledge, tm, t0, gen_s=tm.timings["timing_s/gen"])
        return step

    def one_step_off(self, start: int) -> int:
        pending = self.launch(start)
        step = start - 1
        for step in range(start, self.total + 1):
            tm, t0 = StepTimer(step), time.perf_counter()
            with tm("wait_prev_gen"):
                samples, gen_s = gather_generation(pending)
            self.sync(tm)
            if step < self.total:
                pending = self.launch(step + 1)
            samples, on_policy = self.mix(samples)
            with tm("get_teacher_knowledge"):
                knowledge = self.teacher(samples, step)
            self.train(step, samples, on_policy, knowledge, tm, t0, gen_s=gen_s)
        return step

    def two_step_off(self, start: int) -> int:
        scoring = self.submit_teacher(*gather_generation(self.launch(start)), start)
        pending = self.launch(start + 1) if start < self.total else None
        step = start - 1
        for step in range(start, self.total + 1):
            tm, t0 = StepTimer(step), time.perf_counter()
            with tm("wait_prev_teacher"):
                samples, on_policy, knowledge, gen_s = scoring.result()
            if pending is not None:  # batch step+1 is generated: score it while this step trains
                with tm("wait_prev_gen"):
                    generated = gather_generation(pending)
                self.sync(tm)
                pending = self.launch(step + 2) if step + 2 <= self.total else None
                scoring = self.submit_teacher(*generated, step + 1)
            self.train(step, samples, on_policy, knowledge, tm, t0, gen_s=gen_s)
        return step

    # ---- parts -------------------------------------------------------------------------------------------------
    def draw(self, b: int) -> list[Prompt]:
        """Batch ``b``'s prompts; remembers the cursor after it (what a checkpoint of step ``b`` records)."""
        prompts = self.run.next_prompts()
        self.cursors[b] = self.run.sampler.state_dict()
        return prompts

    def launch(self, b: int) -> list[Any]:
        """Start generating batch ``b`` on the rollout pool (not waited for)."""
        return launch_generation(self.rollouts, self.draw(b), self.params, self.run.gen_seed(b), b)

    def sync(self, tm: StepTimer) -> None:
        s = self.cfg.sync
        with tm("sync_rollout_weights"):
            stats = sync_weights(self.trainer, self.rollouts, self.version, verify=s.verify, timeout_s=s.timeout_s)
        tm.timings["sync/seconds"] = stats.seconds
        tm.timings["sync/bytes_per_s"] = stats.bytes_per_s

    def mix(self, samples: list[Sample]) -> tuple[list[Sample], bool]:
        """GKD's data mix: with probability 1 - ``distill.lmbda`` the batch trains on the dataset's answers instead
        of the student's responses (one seeded draw per batch, in batch order). Returns (samples, on_policy)."""
        if self.cfg.distill.lmbda >= 1.0 or mix_on_policy(self.cfg.distill.lmbda, self.on_policy_gen):
            return samples, True
        tok = self.run.tokenizer
        return dataset_responses(samples, tok, tok.eos_token_id, self.cfg.rollout.response_length), False

    def teacher(self, samples: list[Sample], step: int) -> TeacherKnowledge:
        with get_timeline().span("teacher", step=step, worker="teacher"):
            return get_teacher_knowledge(self.client, samples)

    def submit_teacher(self, generated: list[Sample], gen_s: float, step: int) -> Future:
        """Mix and score batch ``step`` in the teacher thread; the future yields
        ``(samples, on_policy, knowledge, gen_s)``."""
        samples, on_policy = self.mix(generated)  # drawn here, in batch order, so the mix is reproducible
        return self.teacher_pool.submit(lambda: (samples, on_policy, self.teacher(samples, step), gen_s))

    def train(
        self,
        step: int,
        samples: list[Sample],
        on_policy: bool,
        knowledge: TeacherKnowledge,
        tm: StepTimer,
        t0: float,
        gen_s: float,
    ) -> None:
        """reward (metrics only) -> update on the teacher's knowledge -> metrics -> (eval) -> (checkpoint)."""
        run, cfg = self.run, self.cfg
        with tm("reward"):
            reward_stats = run.score(samples)
        batch: TrainBatch = collate(samples, run.tokenizer.pad_token_id)
        knowledge.attach(batch.extras)
        with tm("update_actor"):
            actor_metrics = ray.get(self.trainer.update_distill.remote(batch, step))
        staleness = staleness_metrics(samples, trainer_version=self.version)
        self.version += 1
        run.samples_trained += len(samples)
        tm.timings["timing_s/step"] = time.perf_counter() - t0
        tm.timings.setdefault("timing_s/get_teacher_knowledge", knowledge.seconds)
        metrics = run.step_metrics(samples, batch, tm, reward_stats, actor_metrics, staleness)
        metrics["timing_s/gen"] = gen_s
        metrics["distill/on_policy"] = float(on_policy)
        metrics["distill/teacher_token_logp_mean"] = float(
            (knowledge.token_logp_BT * batch.response_mask_BT).sum() / batch.response_mask_BT.sum().clamp(min=1)
        )
        t = cfg.trainer
        if run.due(t.test_freq, step):
            metrics.update(run.evaluate(self.trainer, step))
        self.logger.log(step, metrics)
        if run.due(t.save_freq, step):
            run.save(step, {"actor_rollout": self.trainer}, sampler_state=self.cursors[step])
        for b in [b for b in self.cursors if b < step]:
            del self.cursors[b]
