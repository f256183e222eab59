"""The trainer: the actor (+ reference, + proximal) model, its optimizer, and a built-in engine over the same weights.

It knows neither the algorithm nor the schedule: its role's spec (``asyncrl.config.specs.TrainerSpec``) says what
they need of it. ``update`` fills what the batch's ``Objective`` asks for (reference and old log-probs) and runs the
one update loop (``asyncrl.trainer.update.fit``). In the sync schedule its engine is the rollout; in the others it
only evaluates, and the weights go to the rollout workers over the sync group (``SyncSenderMixin``).
"""

from __future__ import annotations

import contextlib
import copy
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch

from asyncrl import seeds
from asyncrl.checkpoint import fingerprint
from asyncrl.comm.probe import CollectiveProbe, probe_group
from asyncrl.config.specs import TrainerSpec
from asyncrl.data.collate import Objective, TrainBatch
from asyncrl.models.device import resolve_device
from asyncrl.models.loading import load_model
from asyncrl.models.lora import LoraSpec, apply_lora, reference_policy
from asyncrl.rewards.loop import build_reward_loop, generate_scored
from asyncrl.rewards.reward_fn import build_reward_fn
from asyncrl.rollout.factory import colocated_engine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.trainer import fsdp, gathered
from asyncrl.trainer.data_parallel import DataParallel, rank_name
from asyncrl.trainer.forward import batching, enable_checkpointing, response_logprobs, use_checkpointing
from asyncrl.trainer.update import build_optimizer, fit, warmup_schedule
from asyncrl.types import Generation, Prompt, UpdateResult
from asyncrl.weights.endpoints import SyncSenderMixin
from asyncrl.workers.backends import RoleWorker
from asyncrl.workers.trainer_state import ActorStateMixin


class TrainerWorker(ActorStateMixin, SyncSenderMixin, RoleWorker):
    """``rank``/``world_size``: one of ``trainer.num_workers`` data-parallel ranks (``init_data_parallel`` joins
    them, and shards ``model`` under ``trainer.strategy=fsdp2``); ``serving`` holds the full weights on every rank
    (the trained model itself; under FSDP2 an unsharded copy where the engine is the rollout, else None: the full
    weights are gathered when read, ``asyncrl.trainer.gathered``); rank 0 sends them at a sync and writes
    checkpoints."""

    def __init__(
        self,
        spec: TrainerSpec,
        name: str = "actor_rollout",
        num_threads: int | None = None,
        rank: int = 0,
        world_size: int = 1,
    ):
        super().__init__(rank_name(name, rank), num_threads)
        self.timeline.worker = name
        self.spec = spec
        self.state_file = f"{name}_state.pt"  # the same on every rank: any rank (and any number of them) resumes it
        self.rank, self.world_size = rank, world_size
        self.dp: DataParallel | None = None
        torch.manual_seed(seeds.model_init(spec.engine.seed))
        m = spec.model
        self.device = resolve_device(spec.engine.device, self.name)
        self.model, self.tokenizer = load_model(m.path, dtype=m.dtype, overrides=m.override_config)
        if use_checkpointing(spec.actor.gradient_checkpointing, self.device):
            enable_checkpointing(self.model)
        self.lora = LoraSpec.of(m)
        if self.lora is not None:  # only the adapter trains (and travels at a sync)
            self.model = apply_lora(self.model, self.lora, trainable=True)
        self.model.to(self.device)
        self.pad_token_id = self.tokenizer.pad_token_id
        self.engine = colocated_engine(spec.engine, self.model, self.tokenizer, spec.plan.engine_is_rollout)
        self.reward_fn = build_reward_fn(spec.reward.custom_function, binarize=spec.reward.binarize)
        self.scorer = build_reward_loop(spec.reward, self.reward_fn)
        # the reference policy: a frozen copy of the start, or for LoRA the base model (the adapter switched off)
        self.ref_model = _frozen_copy(self.model) if spec.needs.reference and self.lora is None else None
        self.ref_offload = spec.ref.fsdp_config.param_offload and self.ref_model is not None
        if self.ref_offload:  # unsharded (DDP, one rank): it waits on the host, moved in for its pass
            self.ref_model.to("cpu")
        # the PPO ratio's denominator, as the schedule chose: the behaviour log-probs (bypass), the weights at the
        # start of the sync window (decoupled PPO), or the current weights
        self.prox_model = _frozen_copy(self.model) if spec.plan.old_policy == "prox" else None
        self.serving = self.model
        self.optimizer, self.scheduler = self._build_optimizer()
        self.sync_quantization = spec.engine.rollout.quantization  # fp8: the weights a sync sends are quantized
        self.updates = 0  # training steps applied
        self.version = 0  # weight version = updates // updates_per_version (a sync window's steps share one)

    @property
    def sharded(self) -> bool:
        """FSDP2: ``model`` holds this rank's shards (``serving`` a full copy only where the engine is the rollout)."""
        return self.dp is not None and self.dp.sharded

    def _build_optimizer(self) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
        o = self.spec.actor.optim
        optimizer = build_optimizer([p for p in self.model.parameters() if p.requires_grad], o)
        return optimizer, warmup_schedule(optimizer, o.lr_warmup_steps)

    # ---- data parallelism ----------------------------------------------------------------------------------------
    # (host, port) for the ranks' rendezvous: a free port on ``host``, this rank's node, as for the sync group's store
    data_parallel_endpoint = SyncSenderMixin.weight_sync_endpoint

    def init_data_parallel(self, host: str, port: int, timeout_s: float, backend: str = "gloo") -> None:
        """Join the trainer's data-parallel group (every rank calls this at once, with the same ``backend``: nccl for
        ranks on GPUs of their own) and check the replicas agree."""
        self.dp = DataParallel.create(self.rank, self.world_size, host, port, timeout_s, backend)
        self.dp.check_replicas(self.model, f"{self.name}: start")
        if self.spec.strategy == "fsdp2":
            self._shard()

    def _shard(self) -> None:
        """FSDP2: the trained model's shards in fp32, the master weights, computing in ``model.dtype``; the reference
        and proximal models sharded in ``model.dtype``. Where the engine is the rollout (sync) an unsharded copy in
        ``model.dtype`` is kept to decode from; elsewhere none: what reads the full weights gathers them
        (``asyncrl.trainer.gathered``)."""
        compute = next(self.model.parameters()).dtype
        self.compute_dtype = compute
        self.frame = gathered.skeleton(self.model)  # the structure a gathered copy is built in (meta: no memory)
        rollout = self.spec.plan.engine_is_rollout
        self.serving = copy.deepcopy(self.model) if rollout else None
        self.model.float()
        self.dp.shard_with_fsdp2(self.model, compute, offload=self.spec.actor.fsdp_config.param_offload)
        if self.ref_model is not None:
            self.dp.shard_with_fsdp2(self.ref_model, offload=self.spec.ref.fsdp_config.param_offload)
        if self.prox_model is not None:
            self.dp.shard_with_fsdp2(self.prox_model)
        self.optimizer, self.scheduler = self._build_optimizer()  # over the fp32 shards: plain AdamW
        self.engine = None  # built over a gathered copy for each call (``generate``)
        if rollout:
            self.engine = colocated_engine(self.spec.engine, self.serving, self.tokenizer, rollout)
            self.engine.version = self.version

    @property
    def gathers(self) -> bool:
        """Sharded with no full copy: the full weights are gathered whenever read, with every rank taking part."""
        return self.sharded and self.serving is None

    @contextmanager
    def gathering(self) -> Iterator[gathered.Gather]:
        """A gathering session led by this rank (0); the others are in ``follow_gather`` until it ends."""
        session = gathered.Gather(self.dp, self.model)
        try:
            yield session
        finally:
            session.stop()

    def follow_gather(self) -> None:
        """Ranks >= 1: take part in whatever rank 0 gathers in the call it runs now (a sync, an evaluation, an
        export); returns at once where nothing is gathered."""
        if self.gathers and self.rank != 0:
            gathered.Gather(self.dp, self.model).follow()

    def weight_sync_gather(self) -> tuple[gathered.Gather, torch.dtype] | None:
        return (gathered.Gather(self.dp, self.model), self.compute_dtype) if self.gathers else None

    def probe_data_parallel(self, nbytes: int, timeout_s: float) -> CollectiveProbe | None:
        """An all-reduce and a broadcast of ``nbytes`` on the data-parallel group, every rank at once (``asyncrl
        preflight``); None for a lone rank, which has no group."""
        if self.dp is None:
            return None
        dp = self.dp
        return probe_group(dp.pg, self.rank, self.world_size, dp.backend, dp.device, nbytes, timeout_s)

    # ---- rollout -------------------------------------------------------------------------------------------------
    def generate(
        self, prompts: list[Prompt], params: SamplingParams, seed: int, step: int = -1, score: bool = True
    ) -> Generation:
        """Samples from the current weights, scored by the rule reward here, where they were made (``score``). A
        sharded trainer with no full copy decodes from one gathered for this call and dropped after it."""
        engine = self.engine
        if engine is None:
            with self.gathering() as session:
                full = gathered.full_model(session, self.model, self.frame, self.device)
            engine = colocated_engine(self.spec.engine, full, self.tokenizer, False)
            engine.version = self.version
        return generate_scored(engine, self.scorer, self.timeline, self.name, prompts, params, seed, step, score)

    # ---- training ------------------------------------------------------------------------------------------------
    def _logprobs(self, which: str, batch: TrainBatch, step: int, temperature: float) -> torch.Tensor:
        """Per-token log-probs [B, T] of ``batch``'s responses under the current (``actor``), reference (``ref``) or
        proximal (``prox``: the weights at the start of the sync window) model."""
        if which == "ref" and self.lora is not None:  # LoRA's reference: the actor with its adapter switched off
            model, context = self.model, reference_policy(self.model)
        else:
            actor = self.serving if self.serving is not None else self.model
            model = {"actor": actor, "ref": self.ref_model, "prox": self.prox_model}[which]
            offloaded = which == "ref" and self.ref_offload and not fsdp.is_sharded(model)
            context = _moved_in(model, self.device) if offloaded else contextlib.nullcontext()
            if model is None:
                raise RuntimeError(f"{self.name}: the objective needs the {which} model, not in this trainer's spec")
        how = batching(self.spec.actor)
        with self.timeline.span(f"{which}_logprobs", step=step, worker=self.name), context:
            if self.dp is None:
                return response_logprobs(model, batch, temperature, how)
            # each rank its share of the rows, then every rank the whole [B, T]; a sharded model's forwards are
            # collectives, run as many times on every rank
            rows = self.dp.share(batch)
            rounds = self.dp.rounds if fsdp.is_sharded(model) else None
            own = response_logprobs(model, batch.select(rows), temperature, how, rounds)
            return self.dp.gather_rows(own, rows)

    def update(self, batch: TrainBatch, step: int, num_mini_batches: int | None = None) -> UpdateResult:
        """One training step on ``batch``, whatever its ``Objective``: the reference and old log-probs it asks for
        are filled here (at its temperature), then the one update loop fits its loss.

        ``num_mini_batches`` optimizer steps (default: the spec's). Returns the metrics (with this worker's
        ``timing_s/ref``, ``timing_s/old_log_prob``, ``timing_s/update_actor``) and the weight version after the
        step."""
        objective = batch.policy
        if not isinstance(objective, Objective):
            raise TypeError(f"{self.name}.update: a batch needs an Objective as its policy target (got {objective!r})")
        num_mini = num_mini_batches or self.spec.default_mini_batches
        seed = seeds.update(self.spec.engine.seed, step)
        batch = replace(batch)  # filled below; the caller's batch stays as it was sent
        timings: dict[str, float] = {}
        if objective.needs_ref:
            with _timed(timings, "timing_s/ref"):
                batch.ref_logp_BT = self._logprobs("ref", batch, step, objective.temperature)
        if objective.needs_old:
            old = self.spec.plan.old_policy
            if old == "behaviour":
                batch.old_logp_BT = batch.behav_logp_BT
            else:
                with _timed(timings, "timing_s/old_log_prob"):
                    batch.old_logp_BT = self._logprobs(old, batch, step, objective.temperature)
        with _timed(timings, "timing_s/update_actor"), self.timeline.span("update_actor", step=step, worker=self.name):
            res = fit(self.model, self.optimizer, self.scheduler, batch, self.spec.actor, num_mini, seed, self.dp)
        self._count_update()
        # the process's peak resident memory so far (Linux reports KiB): in-process runs count the driver's too
        timings["perf/trainer_peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        if self.device.type == "cuda":  # the tensors' peak on this rank's GPU, what the memory plan counts
            timings["perf/trainer_peak_cuda_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        timings["perf/trainer_threads"] = float(torch.get_num_threads())  # float sums depend on it (asyncrl replay)
        fp = self._fingerprint() if self.spec.record_consumed else None
        return UpdateResult({**res.metrics, **timings}, self.version, fp)

    def _fingerprint(self) -> str | None:
        """Rank 0's fingerprint of the weights just trained (sharded without a copy: gathered whole, every rank)."""
        if self.gathers:  # gathered one parameter at a time, kept on the host by rank 0 alone
            state = fsdp.gather_to_host(self.model, keep=self.rank == 0)
            return fingerprint({k: v.to(self.compute_dtype) for k, v in state.items()}) if self.rank == 0 else None
        return fingerprint(self.serving.state_dict()) if self.rank == 0 else None

    def _count_update(self) -> None:
        self.updates += 1
        version = self.updates // self.spec.plan.updates_per_version
        copies = [self.serving] if self.sharded and self.serving is not None else []
        if version != self.version and self.prox_model is not None:
            copies.append(self.prox_model)  # a new sync window starts from here
        every = self.spec.needs.ref_refresh_every
        if every > 0 and self.updates % every == 0 and self.ref_model is not None:
            copies.append(self.ref_model)  # the reference catches up (online DPO's ref_update_freq)
        self._copy_weights(copies)
        self.version = version
        if self.engine is not None:
            self.engine.version = self.version  # colocated: the engine generates with these very weights

    def _copy_weights(self, targets: list[torch.nn.Module]) -> None:
        """The trained weights into each of ``targets`` (FSDP2: a sharded target shard by shard, an unsharded one
        gathered from the shards, on every rank at once)."""
        if self.sharded:
            fsdp.copy_shards(self.model, [t for t in targets if fsdp.is_sharded(t)])
            with self.timeline.span("gather_weights", worker=self.name):
                fsdp.gather_into(self.model, [t for t in targets if not fsdp.is_sharded(t)])
        else:
            for t in targets:
                t.load_state_dict(self.model.state_dict())


def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    frozen = copy.deepcopy(model).eval()
    for p in frozen.parameters():
        p.requires_grad_(False)
    return frozen


@contextmanager
def _moved_in(model: torch.nn.Module, device: torch.device) -> Iterator[None]:
    """``model`` on ``device`` for the block, back on the host after (an offloaded unsharded reference)."""
    model.to(device)
    try:
        yield
    finally:
        model.to("cpu")


@contextmanager
def _timed(into: dict[str, float], key: str) -> Iterator[None]:
    t0 = time.perf_counter()
    yield
    into[key] = time.perf_counter() - t0
