"""Plain-Python core of the ``fully_async`` mode: admission control, the message queue, the prompt ledger.

No Ray and no torch here; the pipeline wraps these objects in thin actors. Who calls what:

- Rollouter, per group: ``controller.try_start(gid)`` (None: pause) with ``gid = ledger.issue(epoch, index)``;
  generate; ``queue.put(group)``; then ``controller.on_queued(gid)`` and, for ``result.dropped``,
  ``controller.on_dropped(...)`` and ``ledger.dropped(...)``.
- Trainer, per optimizer update: ``queue.get_batch(B)``; train at version ``v``; ``controller.on_consumed(ids, v)``
  and ``ledger.consumed(ids)``; every ``trigger_parameter_sync_step`` updates push weights and then
  ``controller.on_sync(v + 1)`` on the Rollouter side.
- Checkpoint, with the Rollouter paused: ``controller.state_dict()``, ``queue.snapshot()``, ``ledger.state_dict()``,
  the sampler's state. Resume: load all four, ``ledger.abandoned(controller.abandon_in_flight())``, sync the
  Rollouter to the reloaded version, and re-issue ``ledger.to_reissue()`` before drawing new prompts.

``simulate`` runs exactly this protocol as a discrete-event model (see ``simulate.py``).
"""

from asyncrl.streaming.ledger import EpochReport, PromptLedger, PromptRecord, parse_group_id
from asyncrl.streaming.queue import Group, MessageQueue, PutResult, QueueClosed, QueueSnapshot
from asyncrl.streaming.simulate import ConsumedGroup, SimConfig, SimResult, simulate
from asyncrl.streaming.staleness import AdmissionRefused, StalenessBudget, StalenessController, StalenessViolation

__all__ = [
    "AdmissionRefused",
    "ConsumedGroup",
    "EpochReport",
    "Group",
    "MessageQueue",
    "PromptLedger",
    "PromptRecord",
    "PutResult",
    "QueueClosed",
    "QueueSnapshot",
    "SimConfig",
    "SimResult",
    "StalenessBudget",
    "StalenessController",
    "StalenessViolation",
    "parse_group_id",
    "simulate",
]
