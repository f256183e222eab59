"""WeightSyncGroup without Ray: every rank is a thread of this process over its own gloo group on 127.0.0.1, or over
the ``local`` transport (no process group: each receiver copies rank 0's tensor, as the in-process backend syncs).

This works because a sync group never uses torch.distributed's default group, so several ranks (and several groups)
can live in one process. Every rank runs in a daemon thread joined with a bound, so a broken timeout fails the test
instead of hanging it.
"""

from __future__ import annotations

import socket
import threading

import pytest
import torch

from asyncrl.comm.groups import LOOPBACK, find_free_port, reserve_port
from asyncrl.weights.buckets import ParamMeta, metas_of
from asyncrl.weights.errors import HandshakeError, SyncTimeoutError, WeightSyncError
from asyncrl.weights.group import WeightSyncGroup
from asyncrl.weights.handshake import SyncPlan, validate_plan

TIMEOUT_S = 10.0  # per group operation; joins wait a little longer, so a hang is reported as a failure
JOIN_S = TIMEOUT_S + 20.0


def trainer_params(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(50, 16, generator=g),
        "layer.0.weight": torch.randn(16, 16, generator=g),
        "layer.0.bias": torch.randn(16, generator=g),
        "norm.weight": torch.randn(16, generator=g).to(torch.bfloat16),
        "head.bias": torch.randn(50, generator=g),
    }


def run_ranks(*fns):
    """Run ``fns`` concurrently (one per thread); return their results or the exceptions they raised."""
    results: list[object] = [None] * len(fns)

    def call(i, fn):
        try:
            results[i] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            results[i] = e

    threads = [threading.Thread(target=call, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in threads), "a rank is still running after the join bound (hang)"
    return results


def make_groups(receiver_params, bucket_mb=1.0, sender_params=None, backend="gloo"):
    port = find_free_port()
    world = len(receiver_params) + 1
    sender_params = sender_params or trainer_params()

    def create(rank, params):
        return lambda: WeightSyncGroup.create(
            rank=rank,
            world_size=world,
            port=port,
            params=params,
            bucket_mb=bucket_mb,
            timeout_s=TIMEOUT_S,
            backend=backend,
        )

    return run_ranks(create(0, sender_params), *[create(r + 1, p) for r, p in enumerate(receiver_params)])


def zeros_like_all(params):
    return {k: torch.zeros_like(v) for k, v in params.items()}


@pytest.fixture(params=["gloo", "local"])
def groups(request):
    made = make_groups([zeros_like_all(trainer_params())] * 2, bucket_mb=0.002, backend=request.param)  # ~2 KiB
    assert all(isinstance(g, WeightSyncGroup) for g in made), made
    yield made
    for g in made:
        g.close()


def sync(groups, params, version, verify=True, **send_kwargs):
    sender, *receivers = groups
    return run_ranks(
        lambda: sender.send(params, version, verify=verify, **send_kwargs),
        *[lambda g=g: g.receive(verify=verify, expected_version=version) for g in receivers],
    )


def test_receivers_get_every_parameter_bit_for_bit_with_the_version(groups):
    params = trainer_params(seed=3)
    sent, *received = sync(groups, params, version=5)
    assert len(groups[0].plan.buckets) > 2
    assert sent.bytes == sum(t.numel() * t.element_size() for t in params.values())
    assert sent.buckets == len(groups[0].plan.buckets)
    for named, version, stats in received:
        assert version == 5 and stats.bytes == sent.bytes
        assert [n for n, _ in named] == list(params)
        for name, t in named:
            assert t.dtype == params[name].dtype and torch.equal(t, params[name]), name


def test_corrupted_bucket_is_reported_by_every_receiver_and_the_group_stays_usable(groups):
    params = trainer_params(seed=4)
    _, *received = sync(groups, params, version=2, _corrupt_bucket=1)
    for rank, err in enumerate(received, start=1):
        assert isinstance(err, WeightSyncError)
        assert f"weight sync step/version 2: bucket 1 checksum mismatch on rollout worker rank {rank}" in str(err)
    _, *received = sync(groups, params, version=3)
    assert all(v == 3 for _, v, _ in received)


def test_verifying_receiver_rejects_a_sync_sent_without_checksums(groups):
    sender, r1, r2 = groups
    results = run_ranks(
        lambda: sender.send(trainer_params(), 1, verify=False),
        lambda: r1.receive(verify=True),
        lambda: r2.receive(verify=False),
    )
    assert isinstance(results[1], WeightSyncError) and "sent no checksum" in str(results[1])
    assert results[2][1] == 1


def test_sender_refuses_an_incomplete_state_dict_before_sending_anything(groups):
    params = trainer_params()
    del params["layer.0.bias"]
    with pytest.raises(WeightSyncError, match=r"version 4: the trainer's parameter 'layer.0.bias' is missing"):
        groups[0].send(params, 4)
    _, *received = sync(groups, trainer_params(), version=4)  # nothing was sent: the group is still in step
    assert all(v == 4 for _, v, _ in received)


def test_receiver_whose_sender_never_sends_times_out_naming_version_and_rank(groups):
    _, r1, _ = groups
    (err,) = run_ranks(lambda: r1.receive(timeout_s=1.0, expected_version=7))
    assert isinstance(err, SyncTimeoutError)
    assert "weight sync step/version 7: rollout worker rank 1 timed out after 1 s receiving bucket 0" in str(err)
    with pytest.raises(WeightSyncError, match="group is unusable"):
        r1.receive()


@pytest.mark.parametrize("backend", ["gloo", "local"])
def test_handshake_mismatch_fails_on_every_rank_and_names_the_parameter_and_worker(backend):
    good = zeros_like_all(trainer_params())
    bad = dict(good, **{"layer.0.weight": torch.zeros(16, 8)})
    results = make_groups([good, bad], backend=backend)
    assert all(isinstance(r, HandshakeError) for r in results), results
    assert "parameter 'layer.0.weight' has shape [16, 16] on the trainer but [16, 8] on rollout worker rank 2" in str(
        results[2]
    )
    assert "rank(s) [2] rejected" in str(results[0]) and "rank(s) [2] rejected" in str(results[1])


def test_validate_plan_names_parameters_missing_on_either_side():
    plan = SyncPlan.build(metas_of(trainer_params()), bucket_mb=1.0)
    fewer = [m for m in plan.metas if m.name != "head.bias"]
    with pytest.raises(HandshakeError, match=r"sends parameter 'head.bias' \[50\], which the model on rollout worker"):
        validate_plan(plan, fewer, rank=3)
    more = [*plan.metas, ParamMeta("extra.weight", (2,), torch.float32)]
    with pytest.raises(HandshakeError, match=r"rank 3 has parameter 'extra.weight' \[2\], which the trainer does not"):
        validate_plan(plan, more, rank=3)
    as_bf16 = [ParamMeta(m.name, m.shape, torch.bfloat16) for m in plan.metas]
    validate_plan(plan, as_bf16, rank=3)  # dtypes may differ: the rollout model's copy_ casts


def test_the_local_transport_copies_from_the_senders_tensors_without_a_process_group():
    """In-process ranks: the receivers' tensors are copies (not the trainer's own), and nothing was opened."""
    made = make_groups([zeros_like_all(trainer_params())], backend="local")
    try:
        assert all(g._store is None for g in made)  # no TCPStore, no gloo/NCCL group
        params = trainer_params(seed=9)
        _, (named, version, _) = sync(made, params, version=1)
        for name, t in named:
            assert torch.equal(t, params[name]) and t.data_ptr() != params[name].data_ptr(), name
    finally:
        for g in made:
            g.close()


def test_a_local_group_on_an_address_an_earlier_local_group_used_starts_afresh():
    """A local group binds no port, so a later ``find_free_port`` may hand out an earlier group's again: that group
    (every rank joined, none closed) must not capture the new one's ranks (seen once in the suite: "world size 3, the
    group has 2")."""
    from asyncrl.comm import groups

    port = find_free_port()
    old = [groups.create_process_group("local", "127.0.0.1", port, r, 2, 5.0, "weights")[0] for r in range(2)]
    new = [groups.create_process_group("local", "127.0.0.1", port, r, 3, 5.0, "weights")[0] for r in range(3)]
    assert {id(g.hub) for g in new} != {id(g.hub) for g in old} and len({id(g.hub) for g in new}) == 1


def test_a_reserved_port_is_held_until_rank_0_builds_its_group_on_it():
    """``reserve_port`` starts rank 0's store as it picks the port, so no other process can take the port before the
    rendezvous (``find_free_port`` only names a port free at that moment); the group is then built on that store."""
    port = reserve_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s, pytest.raises(OSError):
        s.bind((LOOPBACK, port))  # taken already: the store listens there

    def create(rank: int, params: dict[str, torch.Tensor]):
        return lambda: WeightSyncGroup.create(rank=rank, world_size=2, port=port, params=params, timeout_s=TIMEOUT_S)

    params = trainer_params()
    made = run_ranks(create(0, params), create(1, zeros_like_all(params)))
    assert all(isinstance(g, WeightSyncGroup) for g in made), made
    try:
        _, (named, version, _) = sync(made, params, version=3)
        assert version == 3 and [n for n, _ in named] == list(params)
        assert all(torch.equal(t, params[n]) for n, t in named)
    finally:
        for g in made:
            g.close()


def test_a_reservation_not_taken_in_time_frees_its_port_at_the_next_one():
    """A set-up that fails before rank 0 joins leaves its store listening only until the next reservation after its
    hold: reservations stay bounded by the set-ups of one hold period."""
    stale = reserve_port(hold_s=0.0)
    kept = reserve_port()  # prunes the stale one, holds its own
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, stale))  # free again
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s, pytest.raises(OSError):
        s.bind((LOOPBACK, kept))
