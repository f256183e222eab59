"""On-policy distillation (GKD): the student generates, a teacher server returns its top-k log-probs at every
response position, and the student minimises ``distill.loss`` against them (``asyncrl.losses.distill_loss``).

Roles: the actor (the student) and the teacher, any server speaking vLLM's ``/v1/completions`` with
``prompt_logprobs``: ``teacher.url``, or an ``asyncrl serve-teacher`` process started here on ``teacher.model_path``
for the run, restarted on its port if it dies (``asyncrl.teacher.launch``; ``teacher/restarts`` counts them) and
stopped at its end. Rewards are scored for the metrics only (``reward/mean`` is the student's training accuracy); the
loss is the teacher's. With ``distill.lmbda`` < 1 a batch trains on the dataset's answers instead of the student's
responses with probability 1 - lmbda (one seeded draw per batch, in batch order).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict

import torch

from asyncrl import losses
from asyncrl.algorithms.base import Algorithm, Finish, Prepared, Trained
from asyncrl.data.collate import collate
from asyncrl.losses.distill_loss import mix_on_policy
from asyncrl.teacher.client import TeacherClient
from asyncrl.teacher.knowledge import dataset_responses, get_teacher_knowledge
from asyncrl.teacher.launch import TeacherEndpoint, teacher_endpoint
from asyncrl.teacher.protocol import TeacherUnavailableError
from asyncrl.telemetry.timeline import get_timeline
from asyncrl.types import Sample


class Distill(Algorithm):
    name = "distill"

    def __init__(self, cfg, tokenizer):  # noqa: ANN001 - as Algorithm's
        super().__init__(cfg, tokenizer)
        self.on_policy_gen = torch.Generator().manual_seed(cfg.trainer.seed)
        self.client: TeacherClient | None = None
        self.endpoint: TeacherEndpoint | None = None

    @contextmanager
    def session(self, run_dir: str) -> Iterator[Distill]:
        """The teacher: started (or reached) and checked against the student's tokenizer before any worker starts."""
        tc = self.cfg.teacher
        with teacher_endpoint(tc, run_dir) as endpoint:
            client = TeacherClient(
                endpoint.url, tc.top_k, tc.max_in_flight, tc.timeout_s, tc.max_retries, tc.backoff_s,
                before_retry=lambda: endpoint.wait_up(tc.startup_timeout_s),
            )  # fmt: skip
            try:
                check = client.check_compatible(self.tokenizer, tc.check_tokenizer)
                self.summary["teacher"] = {"url": endpoint.url, "pid": endpoint.pid, **check}
                self.client, self.endpoint = client, endpoint
                yield self
            finally:
                client.close()

    def on_resume(self, start_step: int) -> None:
        for _ in range(start_step - 1):  # one on/off-policy draw per batch
            mix_on_policy(self.cfg.distill.lmbda, self.on_policy_gen)

    def mix(self, samples: list[Sample]) -> tuple[list[Sample], bool]:
        """GKD's data mix: (samples, on_policy)."""
        if self.cfg.distill.lmbda >= 1.0 or mix_on_policy(self.cfg.distill.lmbda, self.on_policy_gen):
            return samples, True
        tok = self.tokenizer
        return dataset_responses(samples, tok, tok.eos_token_id, self.cfg.rollout.response_length), False

    def prepare(self, samples: list[Sample], step: int) -> Finish:
        samples, on_policy = self.mix(samples)  # drawn here, in batch order, so the mix is reproducible
        client, endpoint = self.client, self.endpoint
        assert client is not None and endpoint is not None, "Distill.prepare outside its session"

        def finish() -> Prepared:
            with get_timeline().span("teacher", step=step, worker="teacher"):
                try:
                    knowledge = get_teacher_knowledge(client, samples)
                except TeacherUnavailableError as e:
                    if endpoint.gave_up is None:
                        raise
                    raise TeacherUnavailableError(f"{e}; {endpoint.gave_up}") from e
            restarts = endpoint.restarts
            if restarts:  # run.summary holds this same dict (open_run copies our entries), so summary.json has them
                self.summary["teacher"]["restarts"] = [asdict(r) for r in restarts]
            batch = collate(samples, self.tokenizer.pad_token_id)
            batch.policy = knowledge.target()
            mask = batch.response_mask_BT
            metrics = {
                "timing_s/get_teacher_knowledge": knowledge.seconds,
                "distill/on_policy": float(on_policy),
                "distill/teacher_token_logp_mean": float(losses.masked_mean(knowledge.token_logp_BT, mask)),
                "teacher/restarts": float(len(restarts)),
            }
            return Prepared(samples, batch, metrics)

        return finish

    def train(self, prepared: Prepared, step: int) -> Trained:
        return self.update_actor(prepared, step)
