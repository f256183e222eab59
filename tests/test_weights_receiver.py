"""The rollout side of a weight sync (``SyncReceiverMixin.receive_weights``): each bucket applied as it arrives.

Every rank is a thread of this process over a real gloo group on 127.0.0.1 (or the ``local`` transport); the rollout
workers hold real RolloutEngines over micro models. What is checked: the engine ends bit-identical to the trainer
whatever the bucket size (plain, fp8 and LoRA syncs); a bucket that fails its checksum is never applied; a sync that
fails after applying some buckets leaves an engine that refuses to generate until the next complete sync; a busy
engine takes nothing and the group stays in step.
"""

from __future__ import annotations

import string

import pytest
import torch

from asyncrl.comm import groups
from asyncrl.comm.groups import LOOPBACK, find_free_port
from asyncrl.models.fp8 import quantize_for_sync
from asyncrl.models.lora import LoraSpec, adapter_tensors, apply_lora, synced_tensors
from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.gate import EngineBusyError, PartialWeightsError
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Prompt, Sample
from asyncrl.weights.buckets import as_bytes, checksum, pack
from asyncrl.weights.endpoints import SyncReceiverMixin
from asyncrl.weights.errors import SyncTimeoutError, WeightSyncError
from asyncrl.weights.group import WeightSyncGroup
from tests.test_weights_group import TIMEOUT_S, run_ranks

TINY_BUCKETS_MB = 0.004  # ~4 KiB: a micro model's sync is tens of buckets
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=4)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer([string.printable[:95]])


def micro(tok, seed: int):
    return build_model("micro", tok, seed=seed, initializer_range=0.3)


def prompts(tok) -> list[Prompt]:
    return [Prompt(index=i, prompt_ids=tok.encode(t), data_source="test", ground_truth="") for i, t in enumerate("ab")]


class Worker(SyncReceiverMixin):
    def __init__(self, engine: RolloutEngine) -> None:
        self.engine = engine


def connect(sent: dict[str, torch.Tensor], engines: list[RolloutEngine], backend: str = "gloo"):
    """The trainer's group (rank 0, sending ``sent``'s layout) and one Worker per engine (ranks 1..)."""
    port, world = find_free_port(), len(engines) + 1
    workers = [Worker(e) for e in engines]
    kwargs = dict(world_size=world, port=port, params=sent, bucket_mb=TINY_BUCKETS_MB, timeout_s=TIMEOUT_S)
    made = run_ranks(
        lambda: WeightSyncGroup.create(rank=0, backend=backend, **kwargs),
        *[
            lambda r=r, w=w: w.init_weight_sync(r, world, LOOPBACK, port, TINY_BUCKETS_MB, TIMEOUT_S, backend)
            for r, w in enumerate(workers, start=1)
        ],
    )
    assert isinstance(made[0], WeightSyncGroup), made
    return made[0], workers


def sync(sender, workers, sent, version, corrupt=None):
    return run_ranks(
        lambda: sender.send(sent, version, verify=True, _corrupt_bucket=corrupt),
        *[lambda w=w: w.receive_weights(verify=True, version=version) for w in workers],
    )


def close(sender, workers):
    sender.close()
    for w in workers:
        w.close_weight_sync()


def weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("backend", ["gloo", "local"])
def test_buckets_applied_as_they_arrive_leave_every_engine_bit_identical_to_the_trainer(tok, backend):
    trainer = micro(tok, 0)
    sent = synced_tensors(trainer)
    engines = [RolloutEngine(micro(tok, 1 + i), tok) for i in range(2)]
    sender, workers = connect(sent, engines, backend)
    try:
        assert len(sender.plan.buckets) > 10
        _, *stats = sync(sender, workers, sent, version=3)
        for engine, s in zip(engines, stats):
            assert engine.version == 3 and s.buckets == len(sender.plan.buckets)
            assert s.bytes == sum(t.numel() * t.element_size() for t in sent.values())
            for name, t in weights(trainer).items():
                assert torch.equal(dict(engine.model.named_parameters())[name], t), name
    finally:
        close(sender, workers)


def test_an_fp8_sync_in_many_buckets_applies_exactly_what_a_whole_update_applies(tok):
    """A quantized weight's values and scales travel in two buckets: they meet before the weight is applied."""
    sent = quantize_for_sync(synced_tensors(micro(tok, 0)))
    streamed, whole = (RolloutEngine(micro(tok, 1), tok, quantization="fp8") for _ in range(2))
    sender, workers = connect(sent, [streamed])
    try:
        names = [b.names for b in sender.plan.buckets]
        assert any(n == ["model.layers.0.mlp.up_proj.weight"] for n in names)  # values alone, scales next
        sync(sender, workers, sent, version=1)
    finally:
        close(sender, workers)
    whole.update_weights(sent, version=1)
    assert streamed.version == 1
    for name, t in weights(whole.model).items():
        assert torch.equal(dict(streamed.model.named_parameters())[name], t), name


def test_a_lora_adapter_synced_in_many_buckets_is_merged_as_a_whole_update_merges_it(tok):
    spec = LoraSpec(rank=4, alpha=8.0, target_modules="all-linear")
    trainer = apply_lora(micro(tok, 0), spec, trainable=True)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in adapter_tensors(trainer).values():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    sent = synced_tensors(trainer)
    streamed, whole = (apply_lora(micro(tok, 0), spec, trainable=False) for _ in range(2))
    for model in (streamed, whole):
        model.merge_adapter()  # a rollout engine runs the adapter merged into the base weights
    engine = RolloutEngine(streamed, tok)
    sender, workers = connect(sent, [engine])
    try:
        assert len(sender.plan.buckets) > 3
        sync(sender, workers, sent, version=2)
    finally:
        close(sender, workers)
    RolloutEngine(whole, tok).update_weights(sent, version=2)
    assert engine.version == 2
    for name, t in weights(whole).items():
        assert torch.equal(dict(streamed.named_parameters())[name], t), name


def test_a_corrupt_first_bucket_is_never_applied_and_the_engine_generates_on(tok):
    sent = synced_tensors(micro(tok, 0))
    engine = RolloutEngine(micro(tok, 1), tok)
    before = weights(engine.model)
    sender, workers = connect(sent, [engine])
    try:
        _, err = sync(sender, workers, sent, version=4, corrupt=0)
        assert isinstance(err, WeightSyncError) and "bucket 0 checksum mismatch on rollout worker rank 1" in str(err)
        assert "mix of two versions" not in str(err)
        assert engine.version == 0 and engine.partial_weights is None
        assert all(torch.equal(p, before[n]) for n, p in engine.model.named_parameters())
        assert len(engine.generate(prompts(tok), PARAMS, seed=0)) == 2
    finally:
        close(sender, workers)


def test_a_sync_cut_short_after_some_buckets_leaves_an_engine_that_refuses_to_generate_until_the_next(tok):
    """No rollback (it would need the second copy the bucket-by-bucket receiver avoids): the engine holds buckets
    0..k-1 of the new version and the rest of the old one, keeps its old version number, and refuses to generate."""
    trainer = micro(tok, 0)
    sent = synced_tensors(trainer)
    engine = RolloutEngine(micro(tok, 1), tok)
    before = weights(engine.model)
    sender, workers = connect(sent, [engine])
    try:
        bad = len(sender.plan.buckets) // 2
        _, err = sync(sender, workers, sent, version=4, corrupt=bad)
        assert isinstance(err, WeightSyncError), err
        assert str(err).startswith(f"weight sync step/version 4: bucket {bad} checksum mismatch on rollout worker")
        assert f"{bad} of {len(sender.plan.buckets)} buckets were applied before it failed" in str(err)
        assert engine.version == 0 and engine.partial_weights is not None
        params = dict(engine.model.named_parameters())
        first, broken = sender.plan.buckets[0].names[0], sender.plan.buckets[bad].names[0]
        assert torch.equal(params[first], sent[first]) and torch.equal(params[broken], before[broken])
        with pytest.raises(PartialWeightsError, match=r"mix of two versions .*version=4.*checksum mismatch"):
            engine.generate(prompts(tok), PARAMS, seed=0)

        _, stats = sync(sender, workers, sent, version=5)  # the group stayed in step: the next sync mends it
        assert not isinstance(stats, Exception), stats
        assert engine.version == 5 and engine.partial_weights is None
        assert all(torch.equal(p, weights(trainer)[n]) for n, p in engine.model.named_parameters())
        assert len(engine.generate(prompts(tok), PARAMS, seed=0)) == 2
    finally:
        close(sender, workers)


def test_a_busy_engine_takes_no_bucket_and_the_group_stays_in_step(tok):
    sent = synced_tensors(micro(tok, 0))
    engine = RolloutEngine(micro(tok, 1), tok)
    before = weights(engine.model)
    blank = Sample.blank(prompts(tok)[0], 0, 0)
    engine.submit([blank], PARAMS, seed=0)  # a streamed row held: no update until interrupt/drain
    sender, workers = connect(sent, [engine])
    try:
        sent_stats, err = sync(sender, workers, sent, version=6)
        assert isinstance(err, EngineBusyError) and not isinstance(sent_stats, Exception)
        assert engine.version == 0 and engine.partial_weights is None
        assert all(torch.equal(p, before[n]) for n, p in engine.model.named_parameters())
        engine.interrupt()
        _, stats = sync(sender, workers, sent, version=7)
        assert not isinstance(stats, Exception), stats
        assert engine.version == 7
    finally:
        close(sender, workers)


def test_a_trainer_lost_mid_sync_times_out_the_receiver_and_its_engine_names_the_mix(tok):
    """Transport failures keep their type (SyncTimeoutError) and, after a bucket was applied, say what it left."""
    trainer = micro(tok, 0)
    sent = synced_tensors(trainer)
    engine = RolloutEngine(micro(tok, 1), tok)
    sender, workers = connect(sent, [engine])

    def first_bucket_only():  # a trainer that dies after bucket 0: its header and bytes go out, nothing more
        bucket = sender.plan.buckets[0]
        payload = as_bytes(pack(bucket, sent))
        header = torch.tensor([8, 0, checksum(payload), 1, bucket.nbytes], dtype=torch.int64)
        for t in (header, payload):
            groups.broadcast(sender._pg, t, groups.Deadline(TIMEOUT_S))

    try:
        _, err = run_ranks(first_bucket_only, lambda: workers[0].receive_weights(True, version=8, timeout_s=1.0))
        assert isinstance(err, SyncTimeoutError), err
        assert "rollout worker rank 1 timed out after 1 s receiving bucket 1" in str(err)
        assert f"1 of {len(sender.plan.buckets)} buckets were applied before it failed" in str(err)
        assert engine.version == 0 and "timed out" in str(engine.partial_weights)
        with pytest.raises(PartialWeightsError):
            engine.generate(prompts(tok), PARAMS, seed=0)
    finally:
        close(sender, workers)
    sender, workers = connect(sent, [engine])  # the broken group is replaced; its first sync mends the engine
    try:
        sync(sender, workers, sent, version=9)
        assert engine.version == 9 and engine.partial_weights is None
    finally:
        close(sender, workers)
