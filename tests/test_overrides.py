"""``model.override_config``: attention implementation and RoPE scaling reach the trainer's model AND the rollout
engine's copy, so both compute the same log-probs, also past the model's trained context."""

from __future__ import annotations

import json

import pytest
import torch

from asyncrl.config import load_config
from asyncrl.models.loading import ModelLoadError, load_model
from asyncrl.rollout.factory import rollout_engine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.schedules import run_training, specs_for
from asyncrl.types import Prompt
from tests.helpers import make_data, make_model, sharpen_attention, train_overrides

# the micro models are trained for 512 positions: linear RoPE scaling x2 stretches them to 1024
LONG_CONTEXT = {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "max_position_embeddings": 1024}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("overrides")
    train, test = make_data(root, size=32, test_size=8)
    model_dir = sharpen_attention(make_model(root, train, seed=0))  # so that RoPE scaling shows in the outputs
    return root, model_dir, train, test


def cfg_with(setup, tmp_path, override: str) -> object:
    _, model_dir, train, test = setup
    return load_config(None, [*train_overrides(model_dir, train, test, tmp_path / "run", 1), override])


def logprobs(model, prompt_ids: list[int], response: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids + response])).logits[0, len(prompt_ids) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def test_rope_scaling_reaches_the_engine_past_the_trained_context(setup, tmp_path):
    _, model_dir, _, _ = setup
    cfg = cfg_with(setup, tmp_path, "model.override_config=" + json.dumps(LONG_CONTEXT).replace(" ", ""))
    trainer, tok = load_model(model_dir, overrides=cfg.model.override_config)  # what the trainer loads
    plain, _ = load_model(model_dir)
    engine = rollout_engine(specs_for(cfg).rollout.engine)  # what a rollout worker builds
    assert engine.model.config.rope_parameters["factor"] == 2.0 and engine.model.config.max_position_embeddings == 1024
    text = "12+34+56=102 " * 45  # 585 characters: past the 512 positions the model was built for
    prompt = Prompt(0, tok(text)["input_ids"], "chain_sum", "")
    assert len(prompt.prompt_ids) > 512
    samples = engine.generate([prompt], SamplingParams(n=2, temperature=1.0, max_new_tokens=8), seed=3)
    got = [torch.tensor(s.logprobs) for s in samples]
    to_trainer = torch.cat(
        [(logprobs(trainer, s.prompt.prompt_ids, s.response_ids) - g).abs() for s, g in zip(samples, got)]
    )
    to_plain = torch.cat(
        [(logprobs(plain, s.prompt.prompt_ids, s.response_ids) - g).abs() for s, g in zip(samples, got)]
    )
    print(f"scaled engine vs trainer: max |diff| {to_trainer.max():.2e}; vs unscaled: mean {to_plain.mean():.2e}")
    assert float(to_trainer.max()) < 1e-4 and float(to_plain.mean()) > 1e-2


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_attention_implementations_agree_between_trainer_and_engine(setup, tmp_path, attn):
    _, model_dir, _, _ = setup
    cfg = cfg_with(setup, tmp_path, f"model.override_config.attn_implementation={attn}")
    engine = rollout_engine(specs_for(cfg).rollout.engine)
    assert engine.model.config._attn_implementation == attn
    other = "sdpa" if attn == "eager" else "eager"
    trainer, tok = load_model(model_dir, overrides={"attn_implementation": other})  # the other kernel
    prompts = [Prompt(i, tok(f"{i}+{i + 5}=")["input_ids"], "chain_sum", "") for i in range(4)]
    samples = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=6), seed=1)
    diff = torch.cat([(logprobs(trainer, s.prompt.prompt_ids, s.response_ids) - torch.tensor(s.logprobs)).abs()
                      for s in samples if s.response_ids])  # fmt: skip
    assert diff.numel() > 8 and float(diff.max()) < 1e-4


def test_bad_overrides_name_the_key(setup):
    _, model_dir, _, _ = setup
    with pytest.raises(ModelLoadError, match=r"override_config\.no_such_knob.*no attribute"):
        load_model(model_dir, overrides={"no_such_knob": 1})
    with pytest.raises(ModelLoadError, match="attn_implementation 'fastest'.*choices: .*eager"):
        load_model(model_dir, overrides={"attn_implementation": "fastest"})
    with pytest.raises(ModelLoadError, match="needs rope_type"):
        load_model(model_dir, overrides={"rope_scaling": {"factor": 2.0}})


def test_a_run_with_overrides_exports_them(setup, tmp_path):
    _, model_dir, train, test = setup
    over = [
        *train_overrides(model_dir, train, test, tmp_path / "run", 1),
        "trainer.schedule=one_step_off",
        "trainer.backend=in_process",
        "model.override_config.rope_scaling.type=linear",  # verl's spelling of the key
        "model.override_config.rope_scaling.factor=2.0",
        "model.override_config.attn_implementation=eager",
    ]
    run_training(load_config(None, over))
    exported = json.loads((tmp_path / "run" / "final" / "config.json").read_text())
    assert exported["rope_parameters"]["rope_type"] == "linear" and exported["rope_parameters"]["factor"] == 2.0
