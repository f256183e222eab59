"""The worker side of the weight sync: mixins that give a worker class the calls the driver's ``WeightSync`` makes.

A trainer worker class inherits :class:`SyncSenderMixin` (it must have ``self.serving``, the full weights, or gather
them: ``weight_sync_gather``), a rollout worker class :class:`SyncReceiverMixin` (it must have ``self.engine``, a
``RolloutEngine``). The backend only carries the calls, so a Ray actor and an in-process worker sync the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from asyncrl.comm.groups import reserve_port
from asyncrl.models.fp8 import quantize_for_sync, sync_layout
from asyncrl.models.lora import is_lora, require_adapter, synced_tensors
from asyncrl.weights.errors import WeightSyncError
from asyncrl.weights.fingerprint import WeightsFingerprint, fingerprint_of
from asyncrl.weights.group import WeightSyncGroup
from asyncrl.weights.handshake import PlanSummary
from asyncrl.weights.stats import SyncStats

__all__ = ["SyncReceiverMixin", "SyncSenderMixin"]


class _WeightSyncMixin:
    """What sender and receiver share: the group object and its (re-)creation."""

    _weight_sync: WeightSyncGroup | None = None

    def init_weight_sync(
        self,
        rank: int,
        world_size: int,
        host: str,
        port: int,
        bucket_mb: float,
        timeout_s: float,
        backend: str | None = None,
    ) -> PlanSummary:
        """Join a new sync group (closing any previous one); returns the plan summary (params, bytes, buckets)."""
        self.close_weight_sync()
        self._weight_sync = WeightSyncGroup.create(
            rank=rank,
            world_size=world_size,
            port=port,
            params=self.weight_sync_tensors(),
            host=host,
            bucket_mb=bucket_mb,
            timeout_s=timeout_s,
            backend=backend,
        )
        return self._weight_sync.plan.summary()

    def weight_sync_ping(self) -> bool:
        """Answers once the actor is constructed and idle: the driver waits for this before the rendezvous."""
        return True

    def close_weight_sync(self) -> None:
        if self._weight_sync is not None:
            self._weight_sync.close()
            self._weight_sync = None

    def _group(self, version: int | None) -> WeightSyncGroup:
        if self._weight_sync is None:
            raise WeightSyncError(
                f"weight sync version {version}: {type(self).__name__} has no sync group (call WeightSync.setup)"
            )
        return self._weight_sync


class SyncSenderMixin(_WeightSyncMixin):
    """For the trainer actor: sends ``self.serving``'s parameters, the full weights (the trained model itself, or a
    sharded trainer's unsharded copy); override ``weight_sync_tensors`` to send others.

    A sharded trainer that keeps no full copy (``weight_sync_gather`` returns a session) sends what it gathers from
    its shards parameter by parameter as the group packs its buckets: its plan is made from shapes alone (meta
    tensors), and every other trainer rank takes part in the gathers from ``follow_gather``."""

    serving: torch.nn.Module | None

    def weight_sync_gather(self) -> Any:
        """A gathering session (``asyncrl.trainer.gathered.Gather``) where the weights are sharded with no full copy,
        else None; with its dtype, the one the weights are sent in."""
        return None

    def weight_sync_tensors(self) -> dict[str, torch.Tensor]:
        """Name -> tensor to send: the model's parameters, tied ones once (as ``RolloutEngine`` expects); for a LoRA
        model its adapter alone, and never a plan without one. Sharded with no full copy: meta tensors of the
        shapes and dtype the sync will send (what the plan needs; ``send_weights`` gathers the data)."""
        fp8 = getattr(self, "sync_quantization", None) == "fp8"
        gather = self.weight_sync_gather()
        if gather is not None:
            session, dtype = gather
            metas = {n: torch.empty(p.shape, dtype=dtype, device="meta") for n, p in session.params.items()}
            return sync_layout(metas) if fp8 else metas
        tensors = synced_tensors(self.serving)
        if is_lora(self.serving):
            require_adapter(list(tensors), f"{type(self).__name__}: weight sync")
        return quantize_for_sync(tensors) if fp8 else tensors

    @contextlib.contextmanager
    def _sent_tensors(self) -> Iterator[Mapping[str, torch.Tensor]]:
        """The tensors a sync sends: gathered as they are read where ``weight_sync_gather`` gives a session (until the
        block ends), and for fp8 then quantized whole (a full copy, transiently)."""
        gather = self.weight_sync_gather()
        if gather is None:
            yield self.weight_sync_tensors()
            return
        session, dtype = gather
        try:
            tensors = session.tensors(dtype)
            yield quantize_for_sync(dict(tensors)) if getattr(self, "sync_quantization", None) == "fp8" else tensors
        finally:
            session.stop()

    def weights_fingerprint(self, dtypes: dict[str, str] | None = None) -> WeightsFingerprint:
        """The crc32 of every tensor a sync sends, each cast to ``dtypes[name]`` (a receiver's) first (``asyncrl
        preflight``)."""
        with self._sent_tensors() as tensors:
            return fingerprint_of(tensors.items(), dtypes)

    def weight_sync_endpoint(self, host: str) -> tuple[str, int]:
        """(host, port) for the group's store: a port on ``host`` where the store already listens (``reserve_port``);
        ``host`` is the trainer's own node address (the driver asks the backend where this worker runs)."""
        return host, reserve_port(host)

    def send_weights(
        self,
        version: int,
        verify: bool = False,
        timeout_s: float | None = None,
        _corrupt_bucket: int | None = None,
    ) -> SyncStats:
        """Send the current weights as ``version`` (collective: every rollout actor must call ``receive_weights``).

        ``timeout_s`` defaults to the one given at set-up; ``_corrupt_bucket`` is the test hook of ``send``.
        """
        timeline = getattr(self, "timeline", None)
        span = timeline.span("send_weights", version=version) if timeline is not None else contextlib.nullcontext()
        with span, self._sent_tensors() as tensors:  # the trainer is busy while it sends: its timeline says so
            return self._group(version).send(tensors, version, verify, timeout_s, _corrupt_bucket)


class SyncReceiverMixin(_WeightSyncMixin):
    """For rollout actors: receives weights and hands them, bucket by bucket as they arrive, to
    ``self.engine.update_weights_streamed``."""

    engine: Any  # asyncrl.rollout.engine.RolloutEngine or asyncrl.rollout.vllm_engine.VllmEngine

    def weight_sync_tensors(self) -> dict[str, torch.Tensor]:
        """What the handshake checks the trainer's plan against."""
        return self.engine.state_dict_for_sync()

    def weights_fingerprint(self) -> WeightsFingerprint:
        """The crc32 of every tensor a sync covers, as the engine holds it now (``asyncrl preflight``)."""
        return fingerprint_of(self.engine.state_dict_for_sync().items())

    def receive_weights(
        self, verify: bool = False, version: int | None = None, timeout_s: float | None = None
    ) -> SyncStats:
        """Receive one sync and apply each bucket as it arrives (checked and held as ``asyncrl.weights.incoming``
        says); ``version`` (when given) must match the one sent. A sync that fails before its first bucket is applied
        leaves the model and its version untouched; one that fails later is not rolled back (that needs a second
        copy): the engine refuses to generate (PartialWeightsError) until the next complete sync, and the error says
        so."""
        incoming = self._group(version).receive_stream(verify, timeout_s, expected_version=version)
        try:
            if incoming.intact:  # bucket 0 passed its checks: nothing is applied otherwise
                self.engine.update_weights_streamed(incoming, version=incoming.version)
        finally:
            try:
                stats = incoming.finish()  # receives what the engine did not take: the ranks stay in step
            except WeightSyncError as e:
                if getattr(self.engine, "partial_weights", None) is None:
                    raise
                raise type(e)(
                    f"{e}; {incoming.handed} of {len(incoming.buckets)} buckets were applied before it failed: "
                    "this worker's weights are a mix of two versions, and it refuses to generate until the next "
                    "complete sync"
                ) from e
        return stats
