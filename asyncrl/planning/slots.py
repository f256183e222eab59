"""The built-in engine's slots (``rollout.continuous``), replayed from row lengths alone: which slot a row takes and
how many slots a decode step runs. The one copy of that rule in the performance model: a batch decode call's steps
(``cost.decode_segments``) and a streaming rank's (``stream.SimRollouter``) both step a ``SimRank``."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from asyncrl.types import Sample


@dataclass
class SimRow:
    """A row on a simulated engine: the sample it continues, the tokens it still needs, the rank's step count when
    it took a slot, the slot it holds."""

    sample: Sample
    need: int
    start: int = 0
    slot: int = -1


@dataclass
class SimRank:
    """One simulated rollout rank: ``t`` decode steps done (and the fraction of the next one paid for), its rows in
    slots as a heap by the step they end at, rows waiting for a slot, prefill seconds owed before its next step.
    ``used``: the slots a step runs, as the built-in engine keeps them (``rollout.continuous``): a row takes the
    lowest free slot, trailing free slots are dropped, and the live rows are packed to the front only once live +
    waiting rows are at most half the slots in use, so a step can run free slots between live ones."""

    slots: int
    t: int = 0
    carry: float = 0.0
    debt: float = 0.0
    live: list[tuple[int, int, SimRow]] = field(default_factory=list)
    waiting: list[SimRow] = field(default_factory=list)
    used: list[SimRow | None] = field(default_factory=list)

    def fill(self) -> None:
        free = [k for k, r in enumerate(self.used) if r is None]
        free += range(len(self.used), self.slots)
        for k in free:
            if not self.waiting:
                break
            r = self.waiting.pop(0)
            r.start, r.slot = self.t, k
            self.used += [None] * (k + 1 - len(self.used))
            self.used[k] = r
            heapq.heappush(self.live, (self.t + r.need, id(r), r))

    def end(self, rows: list[SimRow]) -> None:
        """``rows`` ended at this step: their slots free, then the slots settle once, as the built-in engine's do."""
        for r in rows:
            self.used[r.slot] = None
        while self.used and self.used[-1] is None:
            self.used.pop()
        live = [x for x in self.used if x is not None]
        if len(live) < len(self.used) and len(live) + len(self.waiting) <= len(self.used) // 2:
            for k, x in enumerate(live):
                x.slot = k
            self.used = live

    def step_to(self, t: int) -> list[SimRow]:
        """Decode up to step ``t``: the rows that ended by then leave their slots (``end``) and waiting rows take free
        ones (``fill``); returns the rows that ended."""
        self.t = t
        done = []
        while self.live and self.live[0][0] <= t:
            done.append(heapq.heappop(self.live)[2])
        self.end(done)
        self.fill()
        return done
