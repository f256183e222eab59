"""The driver's typed clients of the weight sync's members: what ``WeightSync``, a supervisor's ping and ``asyncrl
preflight`` ask of the trainer (rank 0 of the sync group, ``SyncSender``) and of every engine that receives
(``SyncReceiver``). The worker side is ``asyncrl.weights.endpoints``; the calls travel through the role backend
(``asyncrl.calls.Handle``), the tensors over the sync group."""

from __future__ import annotations

from asyncrl.calls import Handle, Pending
from asyncrl.weights.fingerprint import WeightsFingerprint
from asyncrl.weights.handshake import PlanSummary
from asyncrl.weights.stats import SyncStats


class SyncPeer:
    """A member of the sync group, sender or receiver."""

    def __init__(self, handle: Handle):
        self.handle = handle

    def weight_sync_ping(self) -> Pending[bool]:
        """Answered at once by a live worker between its calls."""
        return self.handle.call("weight_sync_ping")

    def init_weight_sync(
        self, rank: int, world_size: int, host: str, port: int, bucket_mb: float, timeout_s: float, backend: str | None
    ) -> Pending[PlanSummary]:
        """Join a new sync group (closing any previous one); its plan summary (params, bytes, buckets)."""
        return self.handle.call("init_weight_sync", rank, world_size, host, port, bucket_mb, timeout_s, backend)


class SyncSender(SyncPeer):
    """The trainer: it picks the group's port and sends the weights."""

    def weight_sync_endpoint(self, host: str) -> Pending[tuple[str, int]]:
        """(host, port) for the group's store: a free port on ``host``, the trainer's node."""
        return self.handle.call("weight_sync_endpoint", host)

    def send_weights(
        self, version: int, verify: bool, timeout_s: float, corrupt_bucket: int | None = None
    ) -> Pending[SyncStats]:
        """Send the weights as ``version`` (every receiver must be in ``receive_weights``); ``corrupt_bucket``: the
        test hook that flips a byte of one bucket after its checksum is taken."""
        return self.handle.call("send_weights", version, verify, timeout_s, corrupt_bucket)

    def weights_fingerprint(self, dtypes: dict[str, str]) -> Pending[WeightsFingerprint]:
        """The crc32 of every tensor a sync sends, each cast to ``dtypes[name]`` (a receiver's) first."""
        return self.handle.call("weights_fingerprint", dtypes)


class SyncReceiver(SyncPeer):
    """An engine that receives the weights."""

    def receive_weights(self, verify: bool, version: int, timeout_s: float) -> Pending[SyncStats]:
        return self.handle.call("receive_weights", verify, version, timeout_s)

    def weights_fingerprint(self) -> Pending[WeightsFingerprint]:
        """The crc32 of every tensor a sync covers, as the engine holds it now."""
        return self.handle.call("weights_fingerprint")
