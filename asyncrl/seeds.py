"""Every seed a run derives from ``trainer.seed``, in one place.

Each stream of randomness gets its own function, so two streams never share a seed by accident and a resumed run
draws what the unbroken run drew: every seed depends on (``trainer.seed``, step) only, never on wall time or on how
many calls came before a resume. The multipliers are distinct primes far apart, so the streams of consecutive steps
and of different roles do not overlap for any realistic run length. Rollout sampling is keyed finer, from
``sampling``'s base by the row itself (``asyncrl.rollout.sampling.row_keys``, beside the sampler that draws from the
keys): its tokens do not depend on the schedule that generated it.
"""

from __future__ import annotations


def model_init(seed: int) -> int:
    """The actor's torch seed at start (anything initialised randomly before the first checkpoint)."""
    return seed


def critic_init(seed: int) -> int:
    """The critic's torch seed at start (its value head)."""
    return seed + 17


def sampling(seed: int) -> int:
    """The base of every rollout row's sampling noise, on every schedule and worker
    (``asyncrl.rollout.sampling.row_keys``)."""
    return seed * 1_000_003


def update(seed: int, step: int) -> int:
    """The actor's mini-batch shuffling at step ``step``."""
    return seed * 100_003 + step


def critic_update(seed: int, step: int) -> int:
    """The critic's mini-batch shuffling at step ``step``."""
    return seed * 100_019 + step
