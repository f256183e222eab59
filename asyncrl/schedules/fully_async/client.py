"""The driver's typed client of the fully_async producer (``asyncrl.schedules.fully_async.rollouter.Rollouter``)."""

from __future__ import annotations

from typing import Any

from asyncrl.calls import Pending
from asyncrl.roles.clients import ProducerClient
from asyncrl.schedules.fully_async.recovery import PackedSnapshot, RollouterSnapshot, StreamBatch, Takeover


class RollouterClient(ProducerClient):
    """The fully_async Rollouter."""

    def start(self) -> Pending[None]:
        return self.handle.call("start")

    def get_batch(self, n_groups: int, trainer_version: int) -> Pending[StreamBatch]:
        return self.handle.call("get_batch", n_groups, trainer_version)

    def pause(self, interrupt: bool) -> Pending[float]:
        return self.handle.call("pause", interrupt)

    def resume_generation(self, version: int, snapshot: bool = False) -> Pending[PackedSnapshot | None]:
        return self.handle.call("resume_generation", version, snapshot)

    def snapshot(self) -> Pending[RollouterSnapshot]:
        return self.handle.call("snapshot")

    def restore(self, snapshot: RollouterSnapshot | Takeover) -> Pending[None]:
        return self.handle.call("restore", snapshot)

    def stop(self) -> Pending[None]:
        return self.handle.call("stop")

    def take_metrics(self) -> Pending[dict[str, float]]:
        return self.handle.call("take_metrics")

    def ledger_state(self) -> Pending[dict[str, Any]]:
        return self.handle.call("ledger_state")
