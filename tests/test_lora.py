"""LoRA (``model.lora_rank``): only the adapter trains and only it travels at a sync, and the engine that receives it
samples from the adapted model, not the base (verified through log-probs, not assumed).

Real peft adapters on real transformers models; the schedules run in-process (the same workers as a Ray run).
"""

from __future__ import annotations

import json

import pytest
import torch

from asyncrl.config import ConfigError, load_config
from asyncrl.models.loading import load_model
from asyncrl.models.lora import LoraError, LoraSpec, adapter_tensors, apply_lora, synced_tensors
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.gate import WeightUpdateError
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.schedules import run_training
from asyncrl.types import Prompt
from tests.helpers import length_reward, make_data, make_model, train_overrides

SPEC = LoraSpec(rank=4, alpha=8.0, target_modules="all-linear")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    train, test = make_data(root, size=32, test_size=8)
    return root, make_model(root, train, seed=0), train, test


def trained_adapter(model_dir, seed: int = 1):
    """A LoRA model whose adapter is far from peft's zero start (as after training)."""
    base, tok = load_model(model_dir, for_training=False)
    model = apply_lora(base, SPEC, trainable=True)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in adapter_tensors(model).items():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if "lora_B" in name else 0.5))
    return model.eval(), tok


def response_logprobs(model, prompt_ids: list[int], response: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids + response])).logits[0, len(prompt_ids) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def test_only_the_adapter_trains_and_syncs(setup):
    _, model_dir, _, _ = setup
    model, _ = trained_adapter(model_dir)
    synced = synced_tensors(model)
    assert synced and all(".lora_A." in n or ".lora_B." in n for n in synced)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == set(synced)
    total = sum(p.numel() for p in model.parameters())
    assert sum(t.numel() for t in synced.values()) < 0.2 * total


def test_the_engine_samples_from_the_synced_adapter_not_the_base(setup):
    _, model_dir, _, _ = setup
    trainer_model, tok = trained_adapter(model_dir)
    base, _ = load_model(model_dir, for_training=False)
    receiver = apply_lora(load_model(model_dir, for_training=False)[0], SPEC, trainable=False)
    receiver.merge_adapter()
    engine = RolloutEngine(receiver, tok)
    engine.update_weights(synced_tensors(trainer_model), version=3)
    prompts = [Prompt(i, tok(f"{i}+{i + 2}=")["input_ids"], "chain_sum", "") for i in range(4)]
    samples = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=6), seed=5)
    to_adapted, to_base = [], []
    for s in samples:
        got = torch.tensor(s.logprobs)
        to_adapted.append((response_logprobs(trainer_model, s.prompt.prompt_ids, s.response_ids) - got).abs())
        to_base.append((response_logprobs(base, s.prompt.prompt_ids, s.response_ids) - got).abs())
    adapted, from_base = torch.cat(to_adapted), torch.cat(to_base)
    print(f"engine vs adapted trainer: max |diff| {adapted.max():.2e}; vs the base model: mean {from_base.mean():.2e}")
    assert all(s.versions == [3] * len(s.response_ids) for s in samples)
    assert float(adapted.max()) < 1e-4 and float(from_base.mean()) > 1e-2

    # a second sync re-merges from the base: the old adapter does not stay in the weights
    second, _ = trained_adapter(model_dir, seed=2)
    engine.update_weights(synced_tensors(second), version=4)
    again = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=6), seed=5)
    diff = torch.cat([
        (response_logprobs(second, s.prompt.prompt_ids, s.response_ids) - torch.tensor(s.logprobs)).abs()
        for s in again
    ])  # fmt: skip
    assert float(diff.max()) < 1e-4


def test_a_sync_without_the_adapter_is_refused(setup):
    _, model_dir, _, _ = setup
    base, tok = load_model(model_dir, for_training=False)
    receiver = apply_lora(load_model(model_dir, for_training=False)[0], SPEC, trainable=False)
    engine = RolloutEngine(receiver, tok)
    with pytest.raises(LoraError, match="carries no LoRA adapter tensor"):
        engine.update_weights({n: p.detach() for n, p in base.named_parameters()}, version=1)
    some = dict(list(synced_tensors(receiver).items())[:2])
    with pytest.raises(WeightUpdateError, match="missing from the update"):
        engine.update_weights(some, version=1)
    assert engine.version == 0


def test_bad_lora_settings_name_the_key(setup, tmp_path):
    _, model_dir, train, test = setup
    base = train_overrides(model_dir, train, test, tmp_path / "run", 1)
    with pytest.raises(ConfigError, match="model.lora_rank"):
        load_config(None, [*base, "model.lora_rank=-1"])
    with pytest.raises(ConfigError, match="model.target_modules"):
        load_config(None, [*base, "model.lora_rank=4", "model.target_modules=[]"])
    with pytest.raises(ConfigError, match="lora_adapter_path is set but model.lora_rank is 0"):
        load_config(None, [*base, f"model.lora_adapter_path={tmp_path}"])
    model, _ = load_model(model_dir, for_training=False)
    with pytest.raises(LoraError, match="model.target_modules"):
        apply_lora(model, LoraSpec(4, 8.0, ("no_such_proj",)), trainable=True)


@pytest.mark.parametrize("schedule", ["sync", "one_step_off", "fully_async"])
def test_lora_trains_on_every_schedule_and_exports_merged_and_adapter(setup, schedule):
    root, model_dir, train, test = setup
    run_dir = root / f"run_{schedule}"
    over = [
        *train_overrides(model_dir, train, test, run_dir, 2),
        f"trainer.schedule={schedule}",
        "trainer.backend=in_process",
        "model.lora_rank=4",
        "model.lora_alpha=8",
        "actor.optim.lr=5e-2",
        "actor.use_kl_loss=true",
        length_reward(root),  # rewards that differ within every group: the adapter has a gradient at every step
    ]
    if schedule == "fully_async":
        over.append("async_training.staleness_threshold=1.0")
    summary = run_training(load_config(None, over))
    final = run_dir / "final"
    adapter_dir = final / "adapter"
    assert (adapter_dir / "adapter_config.json").is_file()
    base, tok = load_model(model_dir, for_training=False)
    merged, _ = load_model(final, for_training=False)  # a plain HF directory: AutoModelForCausalLM loads it
    from peft import PeftModel

    with_adapter = PeftModel.from_pretrained(load_model(model_dir, for_training=False)[0], str(adapter_dir)).eval()
    ids = torch.tensor([tok("3+4=7")["input_ids"]])
    with torch.no_grad():
        m, a, b = merged(input_ids=ids).logits, with_adapter(input_ids=ids).logits, base(input_ids=ids).logits
    assert torch.allclose(m, a, atol=1e-4), float((m - a).abs().max())
    assert float((m - b).abs().max()) > 1e-3  # the adapter trained: the policy moved off the base
    adapter_bytes = sum(t.numel() * t.element_size() for t in adapter_tensors(with_adapter).values())
    if schedule != "sync":  # a rollout pool: the sync carried the adapter and nothing else
        assert summary["sync_bytes"] == adapter_bytes
    assert json.loads((adapter_dir / "adapter_config.json").read_text())["r"] == 4


def test_a_resumed_lora_run_equals_the_unbroken_one(setup):
    """The checkpoint holds the adapter and its optimizer (not the unchanged base): 2 + 2 resumed steps give the
    unbroken 4-step run's metrics and final adapter, bit for bit."""
    root, model_dir, train, test = setup
    from safetensors.torch import load_file

    def run(name: str, steps: int, *extra: str) -> list[dict]:
        over = [
            *train_overrides(model_dir, train, test, root / name, steps),
            "trainer.backend=in_process",  # sync: a resume regenerates nothing, so it must be exact
            "trainer.val_before_train=false",
            "model.lora_rank=4",
            "actor.optim.lr=5e-2",
            length_reward(root),
            *extra,
        ]
        run_training(load_config(None, over))
        return [json.loads(line) for line in (root / name / "metrics.jsonl").read_text().splitlines()]

    full = run("full", 4)
    run("resumed", 2)
    ckpt = root / "resumed" / "checkpoints" / "step_2"
    assert (ckpt / "adapter" / "adapter_model.safetensors").is_file() and not (ckpt / "model").exists()
    resumed = run("resumed", 4, "trainer.resume_mode=auto")
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    clocks = ("reward/latency_", "reward/in_flight_max", "reward/scored_during_generation_frac")  # the loop's timing

    def outcomes(m: dict) -> set[str]:
        return {k for k in m if k.startswith(("actor/", "reward/")) and not k.startswith(clocks)}

    for a, b in zip(full, resumed, strict=True):
        keys = outcomes(a)
        assert keys == outcomes(b) and "actor/grad_norm" in keys and "reward/mean" in keys
        for key in keys:
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), (a["step"], key)
    wa = load_file(str(root / "full" / "final" / "adapter" / "adapter_model.safetensors"))
    assert any(k.endswith("lora_B.weight") and wa[k].abs().max() > 0 for k in wa)  # trained: B starts at zero
    wb = load_file(str(root / "resumed" / "final" / "adapter" / "adapter_model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
