"""Bucket planning, pack/unpack and checksums of the weight sync (pure torch, no process group)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.weights.buckets import MIB, ParamMeta, checksum, metas_of, pack, plan_buckets, unpack
from asyncrl.weights.handshake import SyncPlan

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64]


def make_tensors(shapes_and_dtypes, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, (shape, dtype) in enumerate(shapes_and_dtypes):
        if dtype.is_floating_point:
            t = torch.randn(shape, generator=g).to(dtype)
        else:
            t = torch.randint(-1000, 1000, shape, generator=g, dtype=dtype)
        out[f"p{i}"] = t
    return out


shape_st = st.lists(st.integers(0, 9), min_size=0, max_size=3).map(tuple)
params_st = st.lists(st.tuples(shape_st, st.sampled_from(DTYPES)), min_size=1, max_size=8)


@settings(max_examples=40, deadline=None)
@given(params=params_st, bucket_bytes=st.integers(1, 400))
def test_pack_unpack_round_trips_every_parameter_bit_for_bit(params, bucket_bytes):
    tensors = make_tensors(params)
    buckets = plan_buckets(metas_of(tensors), bucket_mb=bucket_bytes / MIB)
    restored = {}
    for b in buckets:
        for name, t in unpack(b, pack(b, tensors).clone()):
            restored[name] = t
    assert list(restored) == list(tensors)  # every parameter once, in order
    for name, t in tensors.items():
        assert restored[name].dtype == t.dtype and torch.equal(restored[name], t), name


@settings(max_examples=40, deadline=None)
@given(params=params_st, bucket_bytes=st.integers(1, 400))
def test_buckets_respect_the_size_limit_and_hold_one_dtype(params, bucket_bytes):
    metas = metas_of(make_tensors(params))
    buckets = plan_buckets(metas, bucket_mb=bucket_bytes / MIB)
    assert [b.index for b in buckets] == list(range(len(buckets)))
    assert [n for b in buckets for n in b.names] == [m.name for m in metas]
    by_name = {m.name: m for m in metas}
    for b in buckets:
        assert all(by_name[n].dtype == b.dtype for n in b.names)
        assert b.nbytes <= bucket_bytes or len(b.entries) == 1


def test_parameter_larger_than_the_bucket_gets_its_own_bucket():
    f32 = torch.float32
    metas = [ParamMeta("a", (10,), f32), ParamMeta("big", (1000,), f32), ParamMeta("b", (10,), f32)]
    buckets = plan_buckets(metas, bucket_mb=100 * 4 / MIB)  # 100 floats per bucket
    assert [b.names for b in buckets] == [["a"], ["big"], ["b"]]
    assert buckets[1].nbytes == 4000


def test_consecutive_small_parameters_share_a_bucket_until_it_is_full():
    metas = [ParamMeta(f"p{i}", (25,), torch.float32) for i in range(10)]  # 100 bytes each
    buckets = plan_buckets(metas, bucket_mb=300 / MIB)
    assert [len(b.entries) for b in buckets] == [3, 3, 3, 1]
    assert [e.offset for e in buckets[0].entries] == [0, 25, 50]


def test_a_dtype_change_starts_a_new_bucket():
    metas = [
        ParamMeta("a", (4,), torch.float32),
        ParamMeta("b", (4,), torch.bfloat16),
        ParamMeta("c", (4,), torch.float32),
    ]
    buckets = plan_buckets(metas, bucket_mb=1.0)
    assert [(b.dtype, b.names) for b in buckets] == [
        (torch.float32, ["a"]),
        (torch.bfloat16, ["b"]),
        (torch.float32, ["c"]),
    ]


def test_plan_rejects_non_positive_bucket_size_and_duplicate_names():
    with pytest.raises(ValueError, match="bucket_mb must be > 0"):
        plan_buckets([ParamMeta("a", (1,), torch.float32)], bucket_mb=0)
    with pytest.raises(ValueError, match="'a' is listed twice"):
        plan_buckets([ParamMeta("a", (1,), torch.float32)] * 2, bucket_mb=1.0)


def test_pack_names_a_missing_or_misshapen_parameter_and_its_bucket():
    tensors = {"a": torch.zeros(3), "b": torch.zeros(2, 2)}
    (bucket,) = plan_buckets(metas_of(tensors), bucket_mb=1.0)
    with pytest.raises(ValueError, match=r"bucket 0 needs parameter 'b'"):
        pack(bucket, {"a": tensors["a"]})
    with pytest.raises(ValueError, match=r"'b' \(bucket 0\) is \[4\] torch.float32, the plan says \[2, 2\]"):
        pack(bucket, {"a": tensors["a"], "b": torch.zeros(4)})
    with pytest.raises(ValueError, match="expects a flat torch.float32 tensor of 7 elements"):
        unpack(bucket, torch.zeros(6))


def test_checksum_is_deterministic_and_detects_any_single_flipped_element():
    flat = torch.randn(257, generator=torch.Generator().manual_seed(1))
    base = checksum(flat)
    assert base == checksum(flat.clone()) and 0 <= base < 2**32
    for i in range(flat.numel()):
        bad = flat.clone()
        bad.view(torch.int32)[i] ^= 1  # the lowest mantissa bit: a value change below any allclose tolerance
        assert checksum(bad) != base, i


def test_checksum_covers_the_bytes_of_every_dtype():
    for dtype in DTYPES:
        flat = torch.arange(64).to(dtype)
        bad = flat.clone()
        bad.view(torch.uint8)[-1] ^= 0x80
        assert checksum(bad) != checksum(flat), dtype


def test_plan_survives_its_json_encoding():
    tensors = make_tensors(
        [((3, 4), torch.float32), ((5,), torch.bfloat16), ((2,), torch.int64), ((7,), torch.float32)]
    )
    plan = SyncPlan.build(metas_of(tensors), bucket_mb=40 / MIB)
    again = SyncPlan.from_bytes(plan.to_bytes())
    assert again == plan
    assert again.nbytes == sum(t.numel() * t.element_size() for t in tensors.values())
