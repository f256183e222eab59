"""Every seed a run derives from ``trainer.seed``, in one place.

Each stream of randomness gets its own function, so two streams never share a seed by accident and a resumed run
draws what the unbroken run drew: every seed depends on (``trainer.seed``, step) only, never on wall time or on how
many calls came before a resume. The multipliers are distinct primes far apart, so the streams of consecutive steps
and of different roles do not overlap for any realistic run length. Rollout sampling is keyed finer, by the row
itself (``row_keys``): its tokens do not depend on the schedule that generated it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


def model_init(seed: int) -> int:
    """The actor's torch seed at start (anything initialised randomly before the first checkpoint)."""
    return seed


def critic_init(seed: int) -> int:
    """The critic's torch seed at start (its value head)."""
    return seed + 17


def sampling(seed: int) -> int:
    """The base of every rollout row's sampling noise, on every schedule and worker (``row_keys``)."""
    return seed * 1_000_003


def row_keys(base: int, rows: Sequence[tuple[int, int, int]]) -> list[int]:
    """One 64-bit key per row ``(epoch, prompt index, row within its group)``: row ``b``'s ``t``-th token is drawn
    with ``uniform(keys[b], position)``, position = the tokens its response already has + ``t``.

    The key depends on the row alone, never on the step, the decode call, the batch it shares or the worker it runs
    on: the same prompt under the same weights samples the same tokens on sync, one_step_off and fully_async, and a
    resumed, re-issued or interrupted row continues its own stream. Two rows of one call with the same triple (a batch
    that holds a prompt twice) get distinct keys: the second by its occurrence number.
    """
    seen: dict[tuple[int, int, int], int] = {}
    keys = []
    for triple in rows:
        k = seen[triple] = seen.get(triple, -1) + 1
        epoch, index, row = triple
        keys.append(_mix(_mix(_mix(_mix(_mix(base & _M64) ^ epoch) ^ index) ^ row) ^ k))
    return keys


def uniform(key: int, position: int) -> float:
    """A uniform draw in [0, 1) from (``key``, ``position``): 53 bits of a 64-bit mix, the same on every machine."""
    return (_mix(key ^ _mix(position)) >> 11) * 2.0**-53


def fresh() -> int:
    """A base from the OS's entropy, for a call that asked for no seed (not reproducible)."""
    return random.SystemRandom().getrandbits(63)


_M64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit integers whose outputs look independent for nearby inputs."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def update(seed: int, step: int) -> int:
    """The actor's mini-batch shuffling at step ``step``."""
    return seed * 100_003 + step


def critic_update(seed: int, step: int) -> int:
    """The critic's mini-batch shuffling at step ``step``."""
    return seed * 100_019 + step
