"""The streaming engine contract: an engine that never stops while it has rows (``fully_async``'s Rollouter).

What ``submit``/``step``/``interrupt``/``drain`` do: docs/schedules/fully_async.md, "How it streams". Beyond it:
``submit`` is safe from any thread; a row is continued as ``resume`` continues it (its own noise, ``RowStreams``, from
the tokens it has; the engine's version on each new token), so an interrupted row already at ``max_new_tokens`` ends
"length" without decoding and a row not "interrupted" comes back unchanged, both at the next step; at most
``capacity`` rows decode at once; ``live_rows()`` counts the rows submitted and not yet reported.

Weight updates only while the engine holds no row (``update_weights`` raises ``EngineBusyError`` otherwise), so every
token's version is the weights that produced it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from asyncrl.types import PrefillStats, Sample, SamplingParams


@runtime_checkable
class StreamingEngine(Protocol):
    """What ``fully_async``'s Producer needs of an engine (built-in: ``RolloutEngine``; vLLM: ``VllmEngine``)."""

    version: int

    @property
    def capacity(self) -> int:
        """Rows decoded at once (a slot each)."""
        ...

    def submit(self, rows: list[Sample], params: SamplingParams, seed: int | None = None) -> None:
        """Blank or interrupted rows wait for a slot, enter the decode at its next step; a group's share one prefill."""

    def step(self) -> list[Sample]:
        """One decode step (waiting rows moved into free slots first); the rows that ended in it, each whole."""

    def interrupt(self) -> list[Sample]:
        """Every row held, continued so far and marked "interrupted"; the engine then holds none."""

    def drain(self) -> list[Sample]:
        """Steps until every row held has ended, taking no new row; returns them."""

    def live_rows(self) -> int: ...

    def take_prefill(self) -> PrefillStats:
        """Prefill token counts since the last call (shared and unshared), then zero."""
        ...
