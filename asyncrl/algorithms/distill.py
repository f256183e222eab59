"""On-policy distillation (GKD; docs/algorithms/distill.md): the student generates, a teacher server returns its top-k
log-probs at every response position, and the student minimises ``distill.loss`` against them. The teacher is
``teacher.url`` or an ``asyncrl serve-teacher`` this run starts, restarts and stops (``asyncrl.teacher.launch``).
Rewards are only logged; with ``distill.lmbda`` < 1 a batch trains on the dataset's answers instead, with probability
1 - lmbda (one seeded draw per batch, in batch order).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from asyncrl import losses
from asyncrl.algorithms import Algorithm, Finish, Prepared
from asyncrl.config import Config, DistillConfig, check
from asyncrl.data.collate import Objective, TrainBatch, collate
from asyncrl.losses.distill_loss import mix_on_policy
from asyncrl.teacher.client import TeacherClient
from asyncrl.teacher.knowledge import dataset_responses, get_teacher_knowledge
from asyncrl.teacher.launch import TeacherEndpoint, teacher_endpoint
from asyncrl.teacher.protocol import TeacherUnavailableError
from asyncrl.telemetry.timeline import get_timeline
from asyncrl.types import Sample


@dataclass
class TeacherTarget(Objective):
    """The teacher's top-k log-probs at every response position (and its log-prob of the response token itself);
    the student's logits are taken at temperature 1, the scale the teacher's log-probs come in."""

    topk_ids_BTK: Tensor  # long [B, T, K]
    topk_logp_BTK: Tensor  # float [B, T, K], over the teacher's full vocabulary
    token_logp_BT: Tensor  # float [B, T]
    distill: DistillConfig  # the losses check the top-k tensors' shapes (``asyncrl.losses.distill_loss``)

    @property
    def temperature(self) -> float:
        return 1.0

    def loss(self, logits_BTV: Tensor, logp_BT: Tensor, batch: TrainBatch, agg: str) -> tuple[Tensor, dict]:
        d, mask = self.distill, batch.response_mask_BT
        ids, teacher = self.topk_ids_BTK, self.topk_logp_BTK
        if d.loss == "forward_kl":
            loss, _ = losses.topk_forward_kl(logits_BTV, ids, teacher, mask, tail=d.tail, loss_agg_mode=agg)
        elif d.loss == "jsd":
            loss, _ = losses.generalized_jsd_topk(
                logits_BTV, ids, teacher, mask, beta=d.beta, tail=d.tail, loss_agg_mode=agg
            )
        else:
            loss, _ = losses.reverse_kl_sampled(
                logp_BT, self.token_logp_BT, mask, estimator=d.reverse_kl_estimator, loss_agg_mode=agg
            )
        stats = {"actor/kl_loss": float(loss.detach())}
        with torch.no_grad():
            stats["actor/entropy"] = float(losses.agg_loss(losses.entropy_from_logits(logits_BTV), mask, agg))
        return loss, stats


@dataclass
class RunTeacher:
    """The run's teacher: its server (started here or the user's) and the client that asks it."""

    endpoint: TeacherEndpoint
    client: TeacherClient
    check: dict[str, object]  # what checking it against the student's tokenizer found (summary.json)


class Distill(Algorithm):
    name = "distill"
    sections = ("teacher", "distill")
    learns_from_rewards = False  # it learns from the teacher; its rewards are only logged

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        tc = cfg.teacher
        check(
            bool(tc.url) or bool(tc.model_path),
            "teacher.model_path",
            tc.model_path,
            "a teacher model directory when teacher.url is not given (distill needs a teacher)",
        )

    def __init__(self, cfg, tokenizer, roles, resources):  # noqa: ANN001 - as Algorithm's
        super().__init__(cfg, tokenizer, roles, resources)
        self.teacher: RunTeacher = resources
        self.on_policy_gen = torch.Generator().manual_seed(cfg.trainer.seed)
        t = self.teacher
        self.summary["teacher"] = {"url": t.endpoint.url, "pid": t.endpoint.pid, **t.check}

    @classmethod
    @contextmanager
    def resources(cls, cfg, tokenizer, run_dir: str) -> Iterator[RunTeacher]:  # noqa: ANN001 - as Algorithm's
        """The teacher: started (or reached) and checked against the student's tokenizer before any worker starts."""
        tc = cfg.teacher
        with teacher_endpoint(tc, run_dir) as endpoint:
            client = TeacherClient(
                endpoint.url,
                tc.top_k,
                tc.max_in_flight,
                tc.timeout_s,
                tc.max_retries,
                tc.backoff_s,
                before_retry=lambda: endpoint.wait_up(tc.startup_timeout_s),
            )
            try:
                yield RunTeacher(endpoint, client, client.check_compatible(tokenizer, tc.check_tokenizer))
            finally:
                client.close()

    def on_resume(self, start_step: int) -> None:
        for _ in range(start_step - 1):  # one on/off-policy draw per batch
            mix_on_policy(self.cfg.distill.lmbda, self.on_policy_gen)

    def prepare(self, samples: list[Sample], step: int) -> Finish:
        on_policy = self.cfg.distill.lmbda >= 1.0 or mix_on_policy(self.cfg.distill.lmbda, self.on_policy_gen)
        if not on_policy:
            tok = self.tokenizer
            samples = dataset_responses(samples, tok, tok.eos_token_id, self.cfg.rollout.response_length)
        client, endpoint = self.teacher.client, self.teacher.endpoint

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
            batch.policy = TeacherTarget(
                knowledge.topk_ids_BTK, knowledge.topk_logp_BTK, knowledge.token_logp_BT, self.cfg.distill
            )
            mask = batch.response_mask_BT
            metrics = {
                "timing_s/get_teacher_knowledge": knowledge.seconds,
                "distill/on_policy": float(on_policy),
                "distill/teacher_token_logp_mean": float(losses.masked_mean(knowledge.token_logp_BT, mask)),
                "teacher/restarts": float(len(restarts)),
            }
            return Prepared(samples, batch, metrics)

        return finish


ALGORITHM = Distill
