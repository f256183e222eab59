"""Per-prompt accounting for ``fully_async``: the evidence that every prompt was trained on exactly once per epoch.

A group lost in a dropped queue slot or with a killed Rollouter, or trained twice after a resume, would not show in
the loss curve. The ledger counts, for every ``(epoch, prompt index)``, its issues, generations, queueings,
consumptions and drops; it travels in the checkpoint, and ``verify_epoch`` reports lost and duplicated prompts. It is
a record, not an enforcer: events for groups no longer open (a second ``consumed``) are counted, not refused, so that
``verify_epoch`` can report them. Group ids are ``"<epoch>:<index>#<attempt>"``, so an id alone names its prompt.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import astuple, dataclass, field
from typing import Any

_STAGES = ("issued", "generated", "queued")  # stages of an open group; it closes when consumed/dropped/abandoned


@dataclass
class PromptRecord:
    """Event counts for one ``(epoch, index)``. ``issued > 1`` only after an abandoned attempt (or a bug)."""

    issued: int = 0
    generated: int = 0
    queued: int = 0
    consumed: int = 0
    dropped: int = 0
    abandoned: int = 0  # in flight when the run was killed; the prompt is re-issued on resume
    filtered: int = 0  # generated, then dropped by dynamic sampling (no reward spread): never trained, not lost


@dataclass
class EpochReport:
    """What ``verify_epoch`` found; lists hold prompt indices. ``ok``: every prompt consumed or dropped exactly once."""

    epoch: int
    num_prompts: int
    consumed_once: int = 0
    never_issued: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)  # issued, not open, never consumed nor dropped
    duplicated: list[int] = field(default_factory=list)  # consumed more than once
    dropped: list[int] = field(default_factory=list)  # evicted by drop_policy="oldest" (counted, not trained on)
    filtered: list[int] = field(default_factory=list)  # dropped by dynamic sampling (no reward spread)
    open: list[int] = field(default_factory=list)  # still in flight or queued: the epoch is not over yet

    @property
    def ok(self) -> bool:
        return not (self.never_issued or self.lost or self.duplicated or self.open)

    @property
    def exactly_once(self) -> bool:
        """Every prompt of the epoch trained on exactly once (no drops either)."""
        return self.ok and not self.dropped and self.consumed_once == self.num_prompts

    def summary(self) -> str:
        parts = [f"epoch {self.epoch}: {self.consumed_once}/{self.num_prompts} prompts consumed once"]
        for name in ("never_issued", "lost", "duplicated", "dropped", "filtered", "open"):
            items = getattr(self, name)
            if items:
                parts.append(f"{name} {len(items)} (e.g. {items[:5]})")
        return "; ".join(parts)


def parse_group_id(group_id: str) -> tuple[int, int, int]:
    """``"<epoch>:<index>#<attempt>"`` -> ``(epoch, index, attempt)``."""
    try:
        key, attempt = group_id.rsplit("#", 1)
        epoch, index = key.split(":")
        return int(epoch), int(index), int(attempt)
    except ValueError:
        raise ValueError(f"group id {group_id!r} is not of the form '<epoch>:<index>#<attempt>'") from None


class PromptLedger:
    """Records each prompt's journey; not thread-safe (keep it with the one loop that owns the checkpoint)."""

    def __init__(self) -> None:
        self._records: dict[tuple[int, int], PromptRecord] = {}
        self._open: dict[str, str] = {}  # group id -> stage, for groups not yet consumed/dropped/abandoned
        self._reissue: list[tuple[int, int]] = []  # prompts whose attempt was abandoned and not yet re-issued

    def _record(self, group_id: str) -> PromptRecord:
        epoch, index, _ = parse_group_id(group_id)
        rec = self._records.get((epoch, index))
        if rec is None:
            raise ValueError(f"PromptLedger: group {group_id!r} was never issued")
        return rec

    def issue(self, epoch: int, index: int) -> str:
        """A group for prompt ``(epoch, index)`` is about to be generated; returns its group id."""
        if epoch < 0 or index < 0:
            raise ValueError(f"PromptLedger.issue: epoch and index must be >= 0 (got {epoch}, {index})")
        rec = self._records.get((epoch, index))
        group_id = f"{epoch}:{index}#{rec.issued if rec else 0}"
        self.replay_issue(group_id)
        return group_id

    def replay_issue(self, group_id: str) -> None:
        """Record an issue under its own id (``issue``'s, or a dead Rollouter's replayed by its replacement:
        ``asyncrl.schedules.fully_async.recovery``), so the next attempt at that prompt gets a new id."""
        epoch, index, attempt = parse_group_id(group_id)
        rec = self._records.setdefault((epoch, index), PromptRecord())
        if group_id in self._open:
            raise ValueError(f"PromptLedger.replay_issue: group {group_id!r} is already open")
        rec.issued = max(rec.issued + 1, attempt + 1)
        self._open[group_id] = "issued"
        if (epoch, index) in self._reissue:
            self._reissue.remove((epoch, index))

    def generated(self, group_id: str) -> None:
        self._record(group_id).generated += 1
        if group_id in self._open:
            self._open[group_id] = "generated"

    def queued(self, group_id: str) -> None:
        self._record(group_id).queued += 1
        if group_id in self._open:
            self._open[group_id] = "queued"

    def consumed(self, group_ids: Iterable[str]) -> None:
        for gid in group_ids:
            self._record(gid).consumed += 1
            self._open.pop(gid, None)

    def dropped(self, group_ids: Iterable[str]) -> None:
        for gid in group_ids:
            self._record(gid).dropped += 1
            self._open.pop(gid, None)

    def filtered(self, group_ids: Iterable[str]) -> None:
        """Groups dynamic sampling dropped (``algorithm.filter_groups``): generated, never trained, not lost."""
        for gid in group_ids:
            self._record(gid).filtered += 1
            self._open.pop(gid, None)

    def abandoned(self, group_ids: Iterable[str]) -> None:
        """Groups lost in flight at a restart: their prompts go on the re-issue list (``to_reissue``)."""
        for gid in group_ids:
            epoch, index, _ = parse_group_id(gid)
            self._record(gid).abandoned += 1
            self._open.pop(gid, None)
            if (epoch, index) not in self._reissue:
                self._reissue.append((epoch, index))

    def to_reissue(self) -> list[tuple[int, int]]:
        """Prompts to generate again before drawing new ones from the sampler (oldest first)."""
        return list(self._reissue)

    def open_groups(self) -> dict[str, str]:
        """Group id -> stage (issued | generated | queued) for every group not yet consumed, dropped or abandoned."""
        return dict(self._open)

    def record(self, epoch: int, index: int) -> PromptRecord | None:
        rec = self._records.get((epoch, index))
        return None if rec is None else PromptRecord(*astuple(rec))

    def verify_epoch(self, epoch: int, num_prompts: int) -> EpochReport:
        """Check prompts ``0 .. num_prompts - 1`` of ``epoch``; call once the epoch is over (else they show as open)."""
        if num_prompts < 1:
            raise ValueError(f"PromptLedger.verify_epoch: num_prompts must be >= 1 (got {num_prompts})")
        stray = sorted(i for e, i in self._records if e == epoch and i >= num_prompts)
        if stray:
            raise ValueError(
                f"PromptLedger.verify_epoch: epoch {epoch} has prompt indices {stray[:5]} >= "
                f"num_prompts={num_prompts}; is this the dataset the run used?"
            )
        open_by_index = Counter(i for e, i, _ in map(parse_group_id, self._open) if e == epoch)
        report = EpochReport(epoch=epoch, num_prompts=num_prompts)
        for index in range(num_prompts):
            rec = self._records.get((epoch, index))
            if rec is None:
                report.never_issued.append(index)
                continue
            if open_by_index[index]:
                report.open.append(index)
            elif rec.consumed == 0 and rec.dropped == 0 and rec.filtered == 0:
                report.lost.append(index)
            if rec.consumed > 1:
                report.duplicated.append(index)
            if rec.dropped:
                report.dropped.append(index)
            if rec.filtered and not rec.consumed:
                report.filtered.append(index)
            report.consumed_once += rec.consumed == 1
        return report

    def forget_epoch(self, epoch: int) -> None:
        """Drop a verified epoch's records to keep checkpoints small; refused while any of its groups is open."""
        if any(parse_group_id(g)[0] == epoch for g in self._open) or any(e == epoch for e, _ in self._reissue):
            raise ValueError(f"PromptLedger.forget_epoch: epoch {epoch} still has open or to-be-reissued prompts")
        self._records = {k: r for k, r in self._records.items() if k[0] != epoch}

    def state_dict(self) -> dict[str, Any]:
        """JSON-friendly: ``records`` rows are ``[epoch, index, issued, generated, queued, consumed, dropped,
        abandoned, filtered]`` (a row of a checkpoint older than ``filtered`` loads with 0)."""
        return {
            "records": [[e, i, *astuple(r)] for (e, i), r in sorted(self._records.items())],
            "open": dict(self._open),
            "reissue": [list(k) for k in self._reissue],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        records = {(int(row[0]), int(row[1])): PromptRecord(*map(int, row[2:])) for row in state["records"]}
        open_groups = {str(k): str(v) for k, v in state["open"].items()}
        bad = [g for g, stage in open_groups.items() if stage not in _STAGES or parse_group_id(g)[:2] not in records]
        if bad:
            raise ValueError(f"PromptLedger.load_state_dict: open groups {bad[:5]} have no record or a bad stage")
        self._records = records
        self._open = open_groups
        self._reissue = [(int(e), int(i)) for e, i in state["reissue"]]
