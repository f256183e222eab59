"""The streaming engine contract: an engine that never stops while it has rows (``fully_async``'s Rollouter).

Beside ``generate``/``resume`` (one blocking call over a batch, which the other schedules keep), a streaming engine
takes rows into a running decode and reports each row the moment it ends:

- ``submit(rows, params, seed)``: rows (blank: no response yet; or partial: an interrupted response to continue)
  wait for a slot and enter the decode at its next step. Safe from any thread. A row is continued as ``resume``
  continues it: its own noise (``RowStreams``: the prompt's epoch and index, its ``row``, from the tokens it has),
  one version per new token (the engine's at that step), an interrupted row already at ``max_new_tokens`` ends
  "length" without decoding and a row not "interrupted" comes back unchanged (both at the next step). A group's
  blank rows submitted together share one prefill.
- ``step()``: one decode step over the live rows, after moving waiting rows into free slots; returns the rows that
  ended in it ("eos" or "length"), each a whole ``Sample`` (the submitted one continued). At most ``capacity``
  rows decode at once.
- ``interrupt()``: every row submitted and not yet reported, continued so far and marked "interrupted" (tokens,
  log-probs, per-token versions kept: partial rollout); the engine then holds no row.
- ``drain()``: steps until every submitted row has ended and returns them (takes no new row meanwhile).
- ``live_rows()``: rows submitted and not yet reported (waiting or decoding).

Weight updates only while the engine holds no row (``update_weights`` raises ``EngineBusyError`` otherwise), so every
token's version is the weights that produced it. A streamed row draws the same tokens as in a batched ``resume``.
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

    def submit(self, rows: list[Sample], params: SamplingParams, seed: int | None = None) -> None: ...

    def step(self) -> list[Sample]: ...

    def interrupt(self) -> list[Sample]: ...

    def drain(self) -> list[Sample]: ...

    def live_rows(self) -> int: ...

    def take_prefill(self) -> PrefillStats:
        """Prefill token counts since the last call (shared and unshared), then zero."""
        ...
