"""The engine options a run resolves by device (``asyncrl.rollout.vllm_options``): pure functions of the options
and ``on_gpu``, so the GPU side is checked here on the CPU (it has not run on a GPU with vLLM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.config.rollout import COLOCATED_SHARE, GPU_SHARE, engine_dtype
from asyncrl.config.schema import ModelConfig, RolloutConfig
from asyncrl.config.specs import EngineSpec
from asyncrl.rollout.vllm_options import VllmOptions, eager, gpu_share, memory_options

GIB = 2**30


def test_engine_dtype_is_bfloat16_on_a_gpu_and_the_trainers_on_the_cpu_unless_rollout_dtype_says():
    assert engine_dtype(None, "float32", on_gpu=True) == "bfloat16"
    assert engine_dtype(None, "float32", on_gpu=False) == "float32"
    assert engine_dtype("float16", "float32", on_gpu=True) == "float16"
    assert engine_dtype("bfloat16", "float32", on_gpu=False) == "bfloat16"


def test_cuda_graphs_are_on_by_default_on_a_gpu_and_off_on_the_cpu():
    assert eager(VllmOptions(), on_gpu=True) is False
    assert eager(VllmOptions(), on_gpu=False) is True
    assert eager(VllmOptions(enforce_eager=True), on_gpu=True) is True
    assert eager(VllmOptions(enforce_eager=False), on_gpu=False) is False


def test_gpu_share_defaults_to_most_of_a_gpu_of_its_own_and_leaves_the_trainer_room_when_shared():
    assert gpu_share(VllmOptions()) == GPU_SHARE == 0.8
    assert gpu_share(VllmOptions(colocated=True)) == COLOCATED_SHARE < 1 - COLOCATED_SHARE
    assert gpu_share(VllmOptions(colocated=True, gpu_memory_utilization=0.3)) == 0.3
    on_gpu = memory_options(VllmOptions(colocated=True, enable_chunked_prefill=False), on_gpu=True)
    assert on_gpu == {"gpu_memory_utilization": COLOCATED_SHARE, "enable_chunked_prefill": False}
    on_cpu = memory_options(VllmOptions(max_num_seqs=4, max_model_len=32), on_gpu=False)
    assert "enable_chunked_prefill" not in on_cpu and on_cpu["max_num_batched_tokens"] == 4 * 32


def test_options_from_a_run_config_carry_the_rollout_keys(tmp_path: Path):
    rollout = RolloutConfig(dtype="bfloat16", enable_chunked_prefill=False, gpu_memory_utilization=0.6)
    spec = EngineSpec(ModelConfig(path=str(tmp_path), dtype="float32"), rollout, 64, 0)
    opts = VllmOptions.from_spec(spec, colocated=True)
    assert (opts.dtype, opts.model_dtype, opts.enable_chunked_prefill) == ("bfloat16", "float32", False)
    assert opts.colocated and gpu_share(opts) == 0.6


def test_the_sync_schedules_builtin_engine_refuses_a_rollout_dtype_it_cannot_decode_in():
    base = ["model.path=m", "data.train_files=[t.parquet]", "model.dtype=float32"]
    with pytest.raises(ConfigError, match="rollout.dtype=bfloat16: the sync schedule's built-in engine"):
        load_config(None, [*base, "rollout.dtype=bfloat16"])
    load_config(None, [*base, "rollout.dtype=bfloat16", "trainer.schedule=one_step_off"])  # its own copy there


def test_a_tensor_parallel_engine_splits_the_cpu_kv_share_and_checks_what_each_worker_received():
    """On the CPU the KV share of the machine is the engine's, split over its workers (vLLM sizes it per worker).
    After a sync each worker's crc32 of what it received must be the sender's: a differing or missing tensor names
    the worker."""
    import torch

    from asyncrl.checkpoint import fingerprint
    from asyncrl.rollout.vllm_model import check_shard_fingerprints

    one, two = (memory_options(VllmOptions(tensor_parallel_size=tp), on_gpu=False) for tp in (1, 2))
    assert two["kv_cache_memory_bytes"] == one["kv_cache_memory_bytes"] // 2
    weights = {"a": torch.arange(6.0), "b": torch.ones(2, 3)}
    sent = fingerprint(weights)
    check_shard_fingerprints(sent, [dict(sent), dict(sent)], "sync")  # as sent: no error
    flipped = fingerprint(
        {**weights, "b": torch.ones(2, 3).index_put_((torch.tensor(0), torch.tensor(1)), torch.tensor(2.0))}
    )
    with pytest.raises(
        ValueError, match=r"sync: tensor-parallel worker 1 received 1 tensor\(s\) other than sent .*: b\)"
    ):
        check_shard_fingerprints(sent, [dict(sent), flipped], "sync")
    with pytest.raises(ValueError, match=r"worker 0 received 1 tensor\(s\) .*missing: a\)"):
        check_shard_fingerprints(sent, [{"b": sent["b"]}], "sync")
