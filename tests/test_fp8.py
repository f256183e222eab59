"""FP8 rollout (``rollout.quantization: fp8``): blockwise float8 e4m3 weights with 128 x 128 scales cross the sync,
the engine runs on them, and the update corrects the mismatch with token-level truncated importance sampling."""

from __future__ import annotations

import pytest
import torch

from asyncrl.algorithms.grpo import effective_correction
from asyncrl.config import ConfigError, load_config
from asyncrl.models.fp8 import (
    FP8,
    SCALE_SUFFIX,
    dequantize_blockwise,
    quantizable,
    quantize_blockwise,
    quantize_for_sync,
)
from asyncrl.models.loading import load_model
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.gate import WeightUpdateError
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.schedules import run_training
from asyncrl.telemetry.metrics import read_metrics
from asyncrl.types import Prompt
from asyncrl.weights.buckets import metas_of
from tests.helpers import make_data, make_model, train_overrides


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    train, test = make_data(root, size=32, test_size=8)
    return root, make_model(root, train, preset="mini", seed=0), train, test


def test_blockwise_quantization_round_trip():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(200, 300, generator=gen) * torch.logspace(-3, 1, 300)  # columns of very different magnitudes
    values, scale = quantize_blockwise(w)
    assert values.dtype == FP8 and values.shape == w.shape and scale.shape == (2, 3)
    back = dequantize_blockwise(values, scale)
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normal values; below fp8's smallest normal (2^-6 of the
    # block's unit) the step is the subnormal spacing 2^-9 of that unit
    unit = scale.repeat_interleave(128, 0)[:200].repeat_interleave(128, 1)[:, :300]
    assert bool(((back - w).abs() <= w.abs() * 2**-4 + unit * 2**-9).all())
    assert float((back - w).abs().max()) > 0  # it is a quantization, not a copy
    for block in (scale[0, 0], scale[1, 2]):
        assert float(block) > 0


def test_a_sync_quarters_the_quantized_layers_and_keeps_the_rest(setup):
    _, model_dir, _, _ = setup
    model, _ = load_model(model_dir, for_training=False)
    tensors = {n: p.detach() for n, p in model.named_parameters()}
    synced = quantize_for_sync(tensors)
    quantized = [n for n in tensors if quantizable(n, tensors[n].shape)]
    assert quantized and all(synced[n].dtype == FP8 and n + SCALE_SUFFIX in synced for n in quantized)
    kept = [n for n in tensors if n not in quantized]
    assert "model.embed_tokens.weight" in kept and all(torch.equal(synced[n], tensors[n]) for n in kept)
    fp32 = sum(tensors[n].numel() * 4 for n in quantized)
    sent = sum(synced[n].numel() + synced[n + SCALE_SUFFIX].numel() * 4 for n in quantized)
    print(f"quantized layers: {sent} bytes against {fp32} in fp32 ({sent / fp32:.3f})")
    assert sent / fp32 < 0.26


def test_the_engine_runs_on_the_quantized_weights(setup):
    _, model_dir, _, _ = setup
    trainer, tok = load_model(model_dir, for_training=False)
    engine = RolloutEngine(load_model(model_dir, for_training=False)[0], tok, quantization="fp8")
    synced = quantize_for_sync({n: p.detach() for n, p in trainer.named_parameters()})
    # the plan the trainer sends is what the engine expects: names, shapes and dtypes
    assert metas_of(engine.state_dict_for_sync()) == metas_of(synced)
    engine.update_weights(synced, version=1)
    name = "model.layers.0.mlp.up_proj.weight"
    got = dict(engine.model.named_parameters())[name]
    assert torch.equal(got, dequantize_blockwise(synced[name], synced[name + SCALE_SUFFIX]))
    assert not torch.equal(got, dict(trainer.named_parameters())[name])
    prompts = [Prompt(i, tok(f"{i}+{i + 3}=")["input_ids"], "chain_sum", "") for i in range(4)]
    samples = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=6), seed=2)
    with torch.no_grad():
        diffs = []
        for s in samples:
            ids = torch.tensor([s.prompt.prompt_ids + s.response_ids])
            logits = trainer(input_ids=ids).logits[0, len(s.prompt.prompt_ids) - 1 : -1]
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.response_ids)[:, None]).squeeze(-1)
            diffs.append((lp - torch.tensor(s.logprobs)).abs())
    gap = torch.cat(diffs)
    print(f"fp8 engine vs fp32 trainer: mean |diff| {gap.mean():.2e}, max {gap.max():.2e}")
    assert 0 < float(gap.mean()) < 0.05


def test_a_quantized_weight_without_its_scales_is_refused(setup):
    _, model_dir, _, _ = setup
    trainer, tok = load_model(model_dir, for_training=False)
    engine = RolloutEngine(load_model(model_dir, for_training=False)[0], tok, quantization="fp8")
    synced = quantize_for_sync({n: p.detach() for n, p in trainer.named_parameters()})
    del synced["model.layers.0.mlp.up_proj.weight" + SCALE_SUFFIX]
    with pytest.raises(WeightUpdateError, match="up_proj.weight' came without its scales"):
        engine.update_weights(synced, version=1)
    assert engine.version == 0


def test_fp8_settings(setup, tmp_path):
    _, model_dir, train, test = setup
    base = [*train_overrides(model_dir, train, test, tmp_path / "r", 1), "rollout.quantization=fp8"]
    with pytest.raises(ConfigError, match="needs rollout.engine=vllm"):
        load_config(None, base)  # sync with the built-in engine decodes with the trainer's own weights
    pool = [*base, "trainer.schedule=one_step_off"]
    assert effective_correction(load_config(None, pool)).rollout_is == "token"  # TIS on by default
    off = load_config(None, [*pool, "algorithm.rollout_correction.rollout_is=disabled"])
    assert effective_correction(off).rollout_is is None
    with pytest.raises(ConfigError, match="model.lora_rank > 0 is not implemented"):
        load_config(None, [*pool, "model.lora_rank=4"])
    with pytest.raises(ConfigError, match="rollout.quantization"):
        load_config(None, [*pool, "rollout.quantization=int4"])


def test_one_step_off_with_fp8_rollout(setup, tmp_path):
    _, model_dir, train, test = setup
    run_dir = tmp_path / "run"
    over = [
        *train_overrides(model_dir, train, test, run_dir, 2),
        "trainer.schedule=one_step_off",
        "trainer.backend=in_process",
        "rollout.quantization=fp8",
    ]
    summary = run_training(load_config(None, over))
    model, _ = load_model(model_dir, for_training=False)
    full = sum(p.numel() * 4 for p in model.parameters())
    print(f"fp8 sync: {summary['sync_bytes']} bytes against {full} in fp32 ({summary['sync_bytes'] / full:.3f})")
    assert summary["sync_bytes"] < full
    metrics = {m["step"]: m for m in read_metrics(run_dir / "metrics.jsonl") if m["step"] >= 1}
    assert sorted(metrics) == [1, 2] and all("rollout_corr/is_mean" in m for m in metrics.values())  # TIS ran
    # batch 1 comes from version 0 on both sides: the whole gap is the rollout's fp8 weights
    assert metrics[1]["staleness/max"] == 0 and metrics[1]["rollout_corr/logprob_diff_mean"] > 1e-3
