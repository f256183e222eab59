"""EpochSampler: continuous deterministic stream across epochs, exactly-once visits, exact resume."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.data.dataset import EpochSampler


def _draw(sampler, n):
    return [sampler.next_batch() for _ in range(n)]


def test_resume_yields_exactly_the_remaining_batches():
    reference = _draw(EpochSampler(num_items=7, batch_size=3, seed=11), 5)

    first = EpochSampler(num_items=7, batch_size=3, seed=11)
    head = _draw(first, 2)
    resumed = EpochSampler(num_items=7, batch_size=3, seed=11)
    resumed.load_state_dict(first.state_dict())

    assert head + _draw(resumed, 3) == reference


def test_batches_span_epoch_boundaries_and_each_epoch_is_a_seeded_permutation():
    sampler = EpochSampler(num_items=5, batch_size=3, seed=2)

    flat = [pair for batch in _draw(sampler, 4) for pair in batch]  # 12 pairs: epochs 0, 1 and part of 2

    assert [e for e, _ in flat] == [0] * 5 + [1] * 5 + [2] * 2
    assert [i for e, i in flat if e == 0] == sampler.epoch_order(0)
    assert [i for e, i in flat if e == 1] == sampler.epoch_order(1)
    assert sorted(sampler.epoch_order(0)) == list(range(5))
    assert sampler.epoch_order(0) != sampler.epoch_order(1)
    assert (sampler.epoch, sampler.position) == (2, 2)


def test_same_seed_same_stream_and_no_shuffle_is_in_order():
    assert _draw(EpochSampler(20, 4, seed=5), 6) == _draw(EpochSampler(20, 4, seed=5), 6)
    assert _draw(EpochSampler(20, 4, seed=5), 6) != _draw(EpochSampler(20, 4, seed=6), 6)
    assert EpochSampler(4, 6, seed=0, shuffle=False).next_batch() == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    num_items=st.integers(1, 13),
    batch_size=st.integers(1, 30),
    seed=st.integers(0, 1000),
    n_batches=st.integers(1, 12),
    split=st.integers(0, 12),
)
def test_every_epoch_index_pair_is_yielded_once_and_resume_at_any_point_matches(
    num_items, batch_size, seed, n_batches, split
):
    split = min(split, n_batches)
    reference = _draw(EpochSampler(num_items, batch_size, seed), n_batches)
    flat = [pair for batch in reference for pair in batch]

    assert all(len(batch) == batch_size for batch in reference)
    assert len(set(flat)) == len(flat)
    assert flat == sorted(flat, key=lambda pair: pair[0])  # epochs never interleave
    full_epochs = len(flat) // num_items
    for epoch in range(full_epochs):
        assert sorted(i for e, i in flat if e == epoch) == list(range(num_items))

    first = EpochSampler(num_items, batch_size, seed)
    head = _draw(first, split)
    resumed = EpochSampler(num_items, batch_size, seed)
    resumed.load_state_dict(first.state_dict())
    assert head + _draw(resumed, n_batches - split) == reference


def test_resume_with_a_different_batch_size_continues_the_same_index_stream():
    reference = [p for b in _draw(EpochSampler(9, 4, seed=1), 6) for p in b]
    first = EpochSampler(9, 4, seed=1)
    head = [p for b in _draw(first, 2) for p in b]
    resumed = EpochSampler(9, 2, seed=1)
    resumed.load_state_dict(first.state_dict())

    assert head + [p for b in _draw(resumed, 8) for p in b] == reference


def test_load_state_refuses_another_dataset_or_seed():
    state = EpochSampler(10, 2, seed=1).state_dict()

    with pytest.raises(ValueError, match="saved num_items=10 but this sampler has num_items=11"):
        EpochSampler(11, 2, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="saved seed=1 but this sampler has seed=2"):
        EpochSampler(10, 2, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="position must be in"):
        EpochSampler(10, 2, seed=1).load_state_dict({"epoch": 0, "position": 10})


def test_iteration_is_endless_and_equals_next_batch():
    assert list(itertools.islice(EpochSampler(3, 2, seed=4), 4)) == _draw(EpochSampler(3, 2, seed=4), 4)


@pytest.mark.parametrize(("num_items", "batch_size", "what"), [(0, 2, "num_items"), (3, 0, "batch_size")])
def test_empty_dataset_or_batch_is_refused(num_items, batch_size, what):
    with pytest.raises(ValueError, match=f"{what} must be positive"):
        EpochSampler(num_items, batch_size, seed=0)
