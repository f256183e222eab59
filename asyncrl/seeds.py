"""Every seed a run derives from ``trainer.seed``, in one place.

Each stream of randomness gets its own function, so two streams never share a seed by accident and a resumed run
draws what the unbroken run drew: every seed depends on (``trainer.seed``, step or call count) only, never on wall
time or on how many calls came before a resume. The multipliers are distinct primes far apart, so the streams of
consecutive steps and of different roles do not overlap for any realistic run length.
"""

from __future__ import annotations


def model_init(seed: int) -> int:
    """The actor's torch seed at start (anything initialised randomly before the first checkpoint)."""
    return seed


def critic_init(seed: int) -> int:
    """The critic's torch seed at start (its value head)."""
    return seed + 17


def generation(seed: int, step: int) -> int:
    """Sampling of batch ``step`` (sync, one_step_off, two_step_off)."""
    return seed * 1_000_003 + step


def rollout_worker(generation_seed: int, worker: int) -> int:
    """Worker ``worker``'s share of a batch split over the rollout pool."""
    return generation_seed * 101 + worker


def rollouter_decode(seed: int, call: int) -> int:
    """The fully_async Rollouter's ``call``-th decode."""
    return seed * 7_000_003 + call


def update(seed: int, step: int) -> int:
    """The actor's mini-batch shuffling at step ``step``."""
    return seed * 100_003 + step


def critic_update(seed: int, step: int) -> int:
    """The critic's mini-batch shuffling at step ``step``."""
    return seed * 100_019 + step
