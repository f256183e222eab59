"""Typed clients, one per role: what a schedule or an algorithm may ask of a worker, and what each call returns; and
the run's roles as one team (``Roles``: every client, where each runs; ``PoolTurns``: how calls to roles on shared
pools take turns), built whole by ``asyncrl.workers.start.start_roles``.

Only the client modules name a worker method by string (``tests/test_layout.py`` checks): this one,
``asyncrl.weights.clients`` (the weight sync's) and ``asyncrl.schedules.fully_async.client`` (the Rollouter's).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

from asyncrl.calls import Handle, Pending
from asyncrl.comm.probe import CollectiveProbe
from asyncrl.comm.transport import WorkerLocation
from asyncrl.data.collate import TrainBatch
from asyncrl.roles.placement import Placement
from asyncrl.types import Generation, PrefillStats, Prompt, Sample, SamplingParams, Scored, UpdateResult

T = TypeVar("T")


class RoleClient:
    """What every role answers: checkpoints and its timeline."""

    def __init__(self, handle: Handle):
        self.handle = handle
        self.name = handle.name

    def save_checkpoint(self, directory: str) -> Pending[None]:
        return self.handle.call("save_checkpoint", directory)

    def load_checkpoint(self, directory: str) -> Pending[int | None]:
        """The role's weight version in the checkpoint (None for a role that keeps no state of its own)."""
        return self.handle.call("load_checkpoint", directory)

    def pop_timeline(self) -> Pending[list[dict]]:
        return self.handle.call("pop_timeline")


class RolloutClient(RoleClient):
    """Who generates a batch: a rollout worker, or the trainer's own engine (sync)."""

    def generate(
        self, prompts: list[Prompt], params: SamplingParams, seed: int, step: int, score: bool = True
    ) -> Pending[Generation]:
        """Samples for ``prompts``; with ``score`` their rule rewards are filled on the worker."""
        return self.handle.call("generate", prompts, params, seed, step, score)


class RolloutWorkerClient(RolloutClient):
    """A rollout worker (``asyncrl.workers.rollout.RolloutWorker``): beyond generating, the weight version its engine
    holds, and the calls of a streaming producer that drives it as one of its ranks."""

    def version(self) -> Pending[int]:
        return self.handle.call("version")

    def stream_submit(self, rows: list[Sample], params: SamplingParams, seed: int) -> Pending[None]:
        """Rows (blank or partial) that enter the rank's running decode at its next step."""
        return self.handle.call("stream_submit", rows, params, seed)

    def stream_wait(self, timeout_s: float) -> Pending[tuple[list[Sample], PrefillStats]]:
        """The rows that ended since the last call (waiting up to ``timeout_s`` for one), and the prefill counts."""
        return self.handle.call("stream_wait", timeout_s)

    def stream_interrupt(self, timeout_s: float) -> Pending[list[Sample]]:
        """Every row the rank holds and nobody took yet: the ended ones, and the live ones partial."""
        return self.handle.call("stream_interrupt", timeout_s)

    def halt(self, timeout_s: float) -> Pending[None]:
        """Drop the rows a dead producer left streaming there."""
        return self.handle.call("halt", timeout_s)


class ProducerClient(RolloutWorkerClient):
    """A streaming schedule's producer: a rollout worker that streams rows to the pool's other ranks too."""

    def attach_ranks(self, ranks: list[Handle]) -> Pending[None]:
        return self.handle.call("attach_ranks", ranks)


class TrainerClient(RolloutClient):
    """The trainer: one worker (``ranks`` = [``handle``]), or data-parallel ranks (``DataParallelTrainerClient``)."""

    def __init__(self, handle: Handle):
        super().__init__(handle)
        self.ranks: list[Handle] = [handle]

    def update(self, batch: TrainBatch, step: int, num_mini_batches: int | None = None) -> Pending[UpdateResult]:
        """One training step on whatever target ``batch`` carries (``asyncrl.data.collate``)."""
        return self.handle.call("update", batch, step, num_mini_batches)

    def export_model(self, directory: str) -> Pending[None]:
        return self.handle.call("export_model", directory)

    def state_dict(self) -> Pending[dict[str, torch.Tensor]]:
        """The full weights, as the trainer holds them (``asyncrl replay`` compares them with a run's)."""
        return self.handle.call("state_dict")


class DataParallelRank(RoleClient):
    """One rank of a data-parallel trainer, for the calls that build and probe the ranks' group."""

    def data_parallel_endpoint(self, host: str) -> Pending[tuple[str, int]]:
        """(host, port) for the ranks' rendezvous: a free port on ``host``, the rank's node."""
        return self.handle.call("data_parallel_endpoint", host)

    def init_data_parallel(self, host: str, port: int, timeout_s: float, backend: str) -> Pending[None]:
        return self.handle.call("init_data_parallel", host, port, timeout_s, backend)

    def probe_data_parallel(self, nbytes: int, timeout_s: float) -> Pending[CollectiveProbe | None]:
        """An all-reduce and a broadcast of ``nbytes`` on the group, every rank at once."""
        return self.handle.call("probe_data_parallel", nbytes, timeout_s)


class _AllRanks(Generic[T]):
    """One call on every data-parallel rank, answered by rank 0's result once all have finished (any rank's error
    is raised)."""

    def __init__(self, calls: list[Pending[T]]):
        self.calls = calls

    def result(self, timeout: float | None = None) -> T:
        deadline = None if timeout is None else time.monotonic() + timeout
        out = [c.result(None if deadline is None else max(0.0, deadline - time.monotonic())) for c in self.calls]
        return out[0]

    def done(self) -> bool:
        return all(c.done() for c in self.calls)


class LeaderHandle:
    """Rank 0's handle of a sharded trainer's ranks: the calls that read the full weights on rank 0 alone (a sync, an
    evaluation, an export, the weights as a dict) also call ``follow_gather`` on every other rank, since a sharded
    trainer with no full copy gathers them with every rank taking part (``asyncrl.trainer.gathered``); the result
    is rank 0's, once every rank has returned. Every other call goes to rank 0 alone."""

    GATHERING = frozenset({"send_weights", "generate", "export_model", "state_dict", "weights_fingerprint"})

    def __init__(self, ranks: list[Handle]):
        self.ranks = ranks
        self.name = ranks[0].name

    def call(self, method: str, *args: Any, **kwargs: Any) -> Pending[Any]:
        lead = self.ranks[0].call(method, *args, **kwargs)
        if method not in self.GATHERING:
            return lead
        return _AllRanks([lead, *(h.call("follow_gather") for h in self.ranks[1:])])

    def kill(self) -> None:
        self.ranks[0].kill()

    def location(self, timeout_s: float | None = None) -> WorkerLocation:
        return self.ranks[0].location(timeout_s)


class DataParallelTrainerClient(TrainerClient):
    """``trainer.num_workers`` data-parallel ranks as one trainer (``asyncrl.trainer.data_parallel``): a training
    step and a resume run on every rank; everything that reads the full weights, generation for evaluation, an
    export, the weight sync, goes to rank 0 (``handle``), and so does a checkpoint unless the trainer is ``sharded``
    (FSDP2: every rank writes its own shards)."""

    def __init__(self, ranks: list[Handle], sharded: bool = False):
        super().__init__(LeaderHandle(ranks) if sharded else ranks[0])
        self.ranks = ranks
        self.sharded = sharded

    def save_checkpoint(self, directory: str) -> Pending[None]:
        if not self.sharded:
            return super().save_checkpoint(directory)
        return _AllRanks([h.call("save_checkpoint", directory) for h in self.ranks])

    def update(self, batch: TrainBatch, step: int, num_mini_batches: int | None = None) -> Pending[UpdateResult]:
        return _AllRanks([h.call("update", batch, step, num_mini_batches) for h in self.ranks])

    def load_checkpoint(self, directory: str) -> Pending[int | None]:
        return _AllRanks([h.call("load_checkpoint", directory) for h in self.ranks])


class CriticClient(RoleClient):
    def values(self, batch: TrainBatch, step: int) -> Pending[Scored]:
        """Values [B, T] of the batch's response states."""
        return self.handle.call("compute_values", batch, step)

    def update(self, batch: TrainBatch, step: int, num_mini_batches: int) -> Pending[dict[str, float]]:
        """The clipped value loss on ``batch.value``."""
        return self.handle.call("update", batch, step, num_mini_batches)


class RewardModelClient(RoleClient):
    def score(self, samples: list[Sample], step: int) -> Pending[Scored]:
        """Reward-model logits [B]."""
        return self.handle.call("score", samples, step)


class RolloutSide(enum.Enum):
    """Where a schedule generates."""

    ACTOR = "actor"  # on the trainer's own worker, with the weights it trains (sync)
    POOL = "pool"  # on rollout.num_workers rollout workers, fed weights over the sync group (one/two_step_off)
    STREAM = "stream"  # on one Rollouter that streams groups through a bounded queue (fully_async)


@dataclass
class Roles:
    """Every role of a run, built whole when the workers start; afterwards only a supervisor changes a member, when
    it replaces a dead rollout worker or Rollouter (``asyncrl.run.supervision``)."""

    trainer: TrainerClient
    rollouts: list[RolloutClient]  # who generates a batch: the trainer itself, or the rollout pool
    placement: Placement
    rollouter: ProducerClient | None = None  # fully_async's producer (its typed client: the schedule's own)
    critic: CriticClient | None = None
    reward_model: RewardModelClient | None = None
    handles: list[Handle] = field(default_factory=list)  # every worker started, once
    respawn: Callable[[int], Handle] | None = None  # a new rollout worker i (Ray's rollout pool: a dead one's stand-in)
    rendezvous: dict[str, str] = field(default_factory=dict)  # group -> host:port of its store (the run's summary)
    stream_ranks: list[Handle] = field(default_factory=list)  # the Rollouter's other rollout ranks (fully_async)

    @property
    def receivers(self) -> list[Handle]:
        """The workers that receive weights from the trainer (none when the trainer's ranks generate themselves)."""
        if self.rollouter is not None:
            return [self.rollouter.handle, *self.stream_ranks]
        return [r.handle for r in self.rollouts if not any(r.handle is h for h in self.trainer.ranks)]

    @property
    def checkpointed(self) -> dict[str, RoleClient]:
        """Roles whose state a checkpoint holds (the rollout side is re-synced from the trainer's weights)."""
        return {"actor": self.trainer, **({"critic": self.critic} if self.critic is not None else {})}

    def locations(self, timeout_s: float | None = None) -> list[WorkerLocation]:
        """Where every worker runs (its node, its GPUs, its device), as the backend reports it."""
        return [h.location(timeout_s) for h in self.handles]

    def timelines(self) -> list[dict]:
        return [e for h in self.handles for e in RoleClient(h).pop_timeline().result()]


class PoolTurns:
    """Calls to roles on different pools run at once; calls to roles sharing a pool take turns (they would fight
    for its CPUs), in the order issued. ``join`` waits for all of them."""

    def __init__(self, placement: Placement):
        self.placement = placement
        self.pending: dict[str, tuple[str, Any]] = {}
        self.results: dict[str, Any] = {}

    def issue(self, key: str, role: str, call: Callable[[], Pending[Any]]) -> None:
        """Start ``call()`` on ``role``'s worker, after the calls already issued to its pool finished."""
        pool = self.placement.pool_of(role)
        for k, (p, pending) in list(self.pending.items()):
            if p == pool:
                self.results[k] = pending.result()
                del self.pending[k]
        self.pending[key] = (pool, call())

    def join(self) -> dict[str, Any]:
        for k, (_, pending) in self.pending.items():
            self.results[k] = pending.result()
        self.pending = {}
        return self.results
