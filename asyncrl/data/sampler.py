"""Deterministic, resumable stream of prompt indices across epochs.

Asynchronous training consumes prompts continuously rather than epoch by epoch, so the sampler is one endless stream:
epoch ``e`` visits every index once in the order of a permutation seeded by ``seed + e``, and a batch that reaches the
end of an epoch simply continues into the next one. Its whole state is ``(epoch, position)``, which makes a resumed
run draw exactly the batches the interrupted run would have drawn next.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any


class EpochSampler:
    """Endless iterator of batches of ``(epoch, index)`` pairs over ``num_items`` dataset positions.

    Every ``(epoch, index)`` pair is yielded exactly once, in order of epoch. With ``shuffle=False`` each epoch is
    ``0 .. num_items - 1`` in order. ``batch_size`` may exceed ``num_items`` (a batch then spans several epochs).
    """

    def __init__(self, num_items: int, batch_size: int, seed: int, shuffle: bool = True):
        if num_items <= 0:
            raise ValueError(f"EpochSampler: num_items must be positive (got {num_items}); is the dataset empty?")
        if batch_size <= 0:
            raise ValueError(f"EpochSampler: batch_size must be positive (got {batch_size})")
        self.num_items = num_items
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self._epoch = 0
        self._position = 0  # next position within the current epoch's order
        self._order_epoch = -1
        self._order: list[int] = []

    @property
    def epoch(self) -> int:
        """Epoch of the next index to be drawn."""
        return self._epoch

    @property
    def position(self) -> int:
        """How many indices of the current epoch have been drawn already."""
        return self._position

    def epoch_order(self, epoch: int) -> list[int]:
        """The order in which epoch ``epoch`` visits the indices (a permutation seeded by ``seed + epoch``)."""
        order = list(range(self.num_items))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def _current_order(self) -> list[int]:
        if self._order_epoch != self._epoch:
            self._order = self.epoch_order(self._epoch)
            self._order_epoch = self._epoch
        return self._order

    def next_batch(self) -> list[tuple[int, int]]:
        """The next ``batch_size`` pairs ``(epoch, index)``, continuing into the next epoch(s) when one runs out."""
        batch: list[tuple[int, int]] = []
        while len(batch) < self.batch_size:
            order = self._current_order()
            take = min(self.batch_size - len(batch), self.num_items - self._position)
            batch.extend((self._epoch, i) for i in order[self._position : self._position + take])
            self._position += take
            if self._position == self.num_items:
                self._epoch += 1
                self._position = 0
        return batch

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        """Yield batches forever (stop by breaking out of the loop)."""
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the stream; the identity fields let ``load_state_dict`` refuse a mismatch."""
        return {
            "epoch": self._epoch,
            "position": self._position,
            "num_items": self.num_items,
            "seed": self.seed,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``. ``batch_size`` may differ from the saved run's; the dataset and order may not."""
        for key in ("num_items", "seed", "shuffle"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"EpochSampler.load_state_dict: saved {key}={state[key]!r} but this sampler has "
                    f"{key}={getattr(self, key)!r}; resuming would visit a different sequence of prompts"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < self.num_items:
            raise ValueError(
                f"EpochSampler.load_state_dict: bad state epoch={epoch} position={position} "
                f"(position must be in [0, {self.num_items}))"
            )
        self._epoch, self._position = epoch, position
