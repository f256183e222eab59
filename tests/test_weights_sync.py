"""Weight sync end to end on a real local Ray cluster: a trainer actor and rollout actors with RolloutEngines.

Models are the "micro" preset (~80k parameters), so each sync is milliseconds; what is checked is the plumbing:
bit-identical weights and versions after a sync, corruption and model mismatches reported with the version, bucket
and worker rank, and timeouts raising instead of hanging (every ``ray.get`` here has a timeout).
"""

from __future__ import annotations

import os
import string
import sys
import time

import pytest
import ray
import torch

from asyncrl.config import WeightSyncConfig
from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.weights.endpoints import SyncReceiverMixin, SyncSenderMixin
from asyncrl.weights.errors import WeightSyncError
from asyncrl.weights.weight_sync import WeightSync
from asyncrl.workers.cluster import RayHandle, as_actor

pytestmark = pytest.mark.ray

TIMEOUT_S = 20.0  # generous for a loaded 2-core machine; the timeout tests pass their own short one
GET_S = 60.0  # bound on every ray.get, so no test can hang


def _tokenizer():
    return build_char_tokenizer([string.printable[:95]])


class Trainer(SyncSenderMixin):
    """Holds a micro Qwen2 whose weights can be changed (as an optimizer step would)."""

    def __init__(self, seed: int) -> None:
        torch.set_num_threads(1)
        self.model = build_model("micro", _tokenizer(), seed=seed)
        self.serving = self.model  # what the sync sends

    def perturb(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.01)

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.model.state_dict().items()}


class Rollout(SyncReceiverMixin):
    """A RolloutEngine over its own, differently initialised micro model (``overrides`` change its shape)."""

    def __init__(self, seed: int, **overrides) -> None:
        torch.set_num_threads(1)
        tok = _tokenizer()
        self.engine = RolloutEngine(build_model("micro", tok, seed=seed, **overrides), tok)

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.engine.model.state_dict().items()}

    def version(self) -> int:
        return self.engine.version

    def partial(self) -> str | None:
        return self.engine.partial_weights

    def busy(self, seconds: float) -> None:
        """Stand-in for a long generate call: the actor cannot take part in a sync meanwhile."""
        time.sleep(seconds)


@pytest.fixture(scope="module")
def cluster():
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    # Ray starts workers at niceness 15: beside the other pytest worker's tests they would not start within GET_S
    # (seen: every actor of this module timed out when it ran first in its pytest worker). init_ray sets the same.
    os.environ["RAY_worker_niceness"] = "0"
    # Ship this module's actor classes by value: Ray workers need not be able to import the tests package.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # a cluster of its own: this module's actors take CPUs, and its failure tests leave workers stuck in a sync
    ray.shutdown()
    env = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    ray.init(
        address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": env}, logging_level="WARNING"
    )
    yield
    ray.shutdown()


def _spawn(cls, *args, **kwargs):
    return ray.remote(as_actor(cls)).options(num_cpus=0.5).remote(*args, **kwargs)


@pytest.fixture(scope="module")
def actors(cluster):
    trainer = _spawn(Trainer, seed=0)
    rollouts = [_spawn(Rollout, seed=10 + i) for i in range(2)]
    ray.get([trainer.weights.remote()] + [r.version.remote() for r in rollouts], timeout=GET_S)  # all started
    return trainer, rollouts


def _sync(trainer, rollouts, bucket_mb=64.0, timeout_s=TIMEOUT_S, verify=False) -> WeightSync:
    """The driver's WeightSync over these actors (push needs no setup of its own: the group lives on the workers)."""
    cfg = WeightSyncConfig(bucket_mb=bucket_mb, verify=verify, timeout_s=timeout_s)
    handles = [RayHandle(r, f"rollout{i}") for i, r in enumerate(rollouts)]
    return WeightSync(RayHandle(trainer, "trainer"), handles, cfg, ready_timeout_s=GET_S)


def setup_weight_sync(trainer, rollouts, bucket_mb=64.0, timeout_s=TIMEOUT_S):
    return _sync(trainer, rollouts, bucket_mb, timeout_s).setup()


def sync_weights(trainer, rollouts, version, verify=False, timeout_s=TIMEOUT_S, _corrupt_bucket=None):
    return _sync(trainer, rollouts, timeout_s=timeout_s, verify=verify).push(version, _corrupt_bucket)


def _assert_rollouts_equal_trainer(trainer, rollouts, version):
    want = ray.get(trainer.weights.remote(), timeout=GET_S)
    for rank, r in enumerate(rollouts, start=1):
        got, got_version = ray.get([r.weights.remote(), r.version.remote()], timeout=GET_S)
        assert got_version == version, rank
        assert list(got) == list(want)
        for name, t in want.items():
            assert torch.equal(got[name], t), f"{name} differs on rollout worker rank {rank}"


def test_sync_makes_every_rollout_worker_bit_identical_to_the_trainer(actors):
    trainer, rollouts = actors
    ray.get(trainer.perturb.remote(seed=1), timeout=GET_S)
    before = ray.get(rollouts[0].weights.remote(), timeout=GET_S)
    want = ray.get(trainer.weights.remote(), timeout=GET_S)
    assert not torch.equal(before["model.embed_tokens.weight"], want["model.embed_tokens.weight"])

    summary = setup_weight_sync(trainer, rollouts, bucket_mb=64.0, timeout_s=TIMEOUT_S)
    assert summary.buckets == 1
    stats = sync_weights(trainer, rollouts, version=1, verify=True, timeout_s=TIMEOUT_S)
    assert stats.bytes == summary.bytes == sum(t.numel() * 4 for k, t in want.items() if k != "lm_head.weight")
    _assert_rollouts_equal_trainer(trainer, rollouts, version=1)


def test_sync_with_many_small_buckets_delivers_the_newest_weights(actors):
    trainer, rollouts = actors
    summary = setup_weight_sync(trainer, rollouts, bucket_mb=0.02, timeout_s=TIMEOUT_S)  # 20 KiB buckets
    assert summary.buckets > 5
    for version in (2, 3):
        ray.get(trainer.perturb.remote(seed=version), timeout=GET_S)
        stats = sync_weights(trainer, rollouts, version=version, verify=True, timeout_s=TIMEOUT_S)
        assert stats.buckets == summary.buckets
        _assert_rollouts_equal_trainer(trainer, rollouts, version=version)


def test_a_corrupted_bucket_is_never_applied_and_a_sync_cut_short_is_named_until_the_next(actors):
    """Buckets are applied as they arrive: a corrupt first bucket leaves the weights untouched; a corrupt last one
    leaves the buckets before it applied, which the error says (the engine refuses to generate until the next sync)."""
    trainer, rollouts = actors
    summary = setup_weight_sync(trainer, rollouts, bucket_mb=0.02, timeout_s=TIMEOUT_S)
    ray.get(trainer.perturb.remote(seed=4), timeout=GET_S)
    stale = ray.get(rollouts[1].weights.remote(), timeout=GET_S)
    with pytest.raises(WeightSyncError) as err:
        sync_weights(trainer, rollouts, version=4, verify=True, timeout_s=TIMEOUT_S, _corrupt_bucket=0)
    for rank in (1, 2):
        assert f"bucket 0 checksum mismatch on rollout worker rank {rank}" in str(err.value)
    assert str(err.value).startswith("weight sync step/version 4:")
    now = ray.get(rollouts[1].weights.remote(), timeout=GET_S)
    assert ray.get(rollouts[1].version.remote(), timeout=GET_S) != 4
    assert all(torch.equal(now[k], stale[k]) for k in stale)

    bucket = summary.buckets - 1
    with pytest.raises(WeightSyncError) as err:
        sync_weights(trainer, rollouts, version=4, verify=True, timeout_s=TIMEOUT_S, _corrupt_bucket=bucket)
    for rank in (1, 2):
        assert f"bucket {bucket} checksum mismatch on rollout worker rank {rank}" in str(err.value)
    assert f"{bucket} of {summary.buckets} buckets were applied before it failed" in str(err.value)
    assert ray.get(rollouts[1].version.remote(), timeout=GET_S) != 4
    assert ray.get(rollouts[1].partial.remote(), timeout=GET_S) is not None

    sync_weights(trainer, rollouts, version=5, verify=True, timeout_s=TIMEOUT_S)  # the group is still usable
    _assert_rollouts_equal_trainer(trainer, rollouts, version=5)
    assert ray.get(rollouts[1].partial.remote(), timeout=GET_S) is None


def test_handshake_rejects_a_rollout_model_of_another_shape_naming_parameter_and_rank(actors):
    trainer, rollouts = actors
    wider = _spawn(Rollout, seed=20, intermediate_size=96)  # the micro preset has 128
    try:
        with pytest.raises(WeightSyncError) as err:
            setup_weight_sync(trainer, [rollouts[0], wider], timeout_s=TIMEOUT_S)
        text = str(err.value)
        assert "parameter 'model.layers.0.mlp.gate_proj.weight' has shape [128, 64] on the trainer" in text
        assert "but [96, 64] on rollout worker rank 2" in text
    finally:
        ray.kill(wider)


def test_receiver_whose_trainer_never_sends_raises_instead_of_hanging(actors):
    trainer, rollouts = actors
    setup_weight_sync(trainer, rollouts, timeout_s=TIMEOUT_S)
    ref = rollouts[0].receive_weights.remote(verify=True, version=6, timeout_s=2.0)  # the trainer is never asked
    with pytest.raises(WeightSyncError) as err:
        ray.get(ref, timeout=GET_S)
    assert "weight sync step/version 6: rollout worker rank 1 timed out after 2 s" in str(err.value)


def test_sync_names_the_worker_that_did_not_finish(actors):
    trainer, rollouts = actors
    setup_weight_sync(trainer, rollouts, timeout_s=TIMEOUT_S)
    rollouts[1].busy.remote(6.0)  # still busy when the driver gives up (2 s + grace)
    with pytest.raises(WeightSyncError) as err:
        sync_weights(trainer, rollouts, version=7, timeout_s=2.0)
    text = str(err.value)
    assert text.startswith("weight sync step/version 7:")
    assert "rollout worker rank 2 did not finish within 2 s" in text
    # After the failure a new group works again (the busy worker first finishes its queued calls).
    setup_weight_sync(trainer, rollouts, timeout_s=TIMEOUT_S)
    sync_weights(trainer, rollouts, version=8, timeout_s=TIMEOUT_S)
    _assert_rollouts_equal_trainer(trainer, rollouts, version=8)
