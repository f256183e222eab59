"""RolloutEngine.update_weights: in-place copies, tied names, validation before copying, refusal while busy."""

import re
import string

import pytest
import torch

from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.gate import EngineBusyError, WeightUpdateError
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Prompt

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)
EMBED = "model.embed_tokens.weight"


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer([string.printable[:95]])


def make_model(tok, seed):
    return build_model("micro", tok, seed=seed, initializer_range=0.3)


def make_prompts(tok):
    texts = ["a", "hello world", "What is 2+2?"]
    return [Prompt(index=i, prompt_ids=tok.encode(t), data_source="test", ground_truth="") for i, t in enumerate(texts)]


def test_update_weights_switches_outputs_to_the_new_weights_and_sets_version(tok):
    engine = RolloutEngine(make_model(tok, 0), tok)
    other = make_model(tok, 1)
    before = [s.response_ids for s in engine.generate(make_prompts(tok), GREEDY)]
    expected = [s.response_ids for s in RolloutEngine(other, tok).generate(make_prompts(tok), GREEDY)]
    assert before != expected

    engine.update_weights(other.named_parameters(), version=7)  # an iterable of (name, tensor) pairs
    samples = engine.generate(make_prompts(tok), GREEDY)
    assert [s.response_ids for s in samples] == expected
    assert engine.version == 7 and all(s.versions == [7] * len(s.response_ids) for s in samples)


def test_state_dict_for_sync_lists_each_parameter_once(tok):
    model = make_model(tok, 0)
    names = list(RolloutEngine(model, tok).state_dict_for_sync())
    assert names == [name for name, _ in model.named_parameters()]
    assert EMBED in names and "lm_head.weight" not in names  # tied: sent once


def test_tied_embedding_can_be_sent_as_lm_head_weight(tok):
    model = make_model(tok, 0)
    engine = RolloutEngine(model, tok)
    update = {("lm_head.weight" if n == EMBED else n): t + 1.0 for n, t in engine.state_dict_for_sync().items()}
    engine.update_weights(update, version=1)
    torch.testing.assert_close(model.model.embed_tokens.weight, update["lm_head.weight"])
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_unknown_parameter_is_named_and_nothing_is_copied(tok):
    model = make_model(tok, 0)
    engine = RolloutEngine(model, tok)
    update = {n: torch.zeros_like(t) for n, t in engine.state_dict_for_sync().items()}
    update["model.layers.9.mlp.up_proj.weight"] = torch.zeros(2, 2)
    embed_before = model.model.embed_tokens.weight.clone()
    with pytest.raises(WeightUpdateError, match=r"unknown parameter 'model.layers.9.mlp.up_proj.weight'"):
        engine.update_weights(update, version=1)
    assert engine.version == 0 and torch.equal(model.model.embed_tokens.weight, embed_before)


def test_wrong_shape_is_reported_with_both_shapes(tok):
    engine = RolloutEngine(make_model(tok, 0), tok)
    update = dict(engine.state_dict_for_sync())
    update[EMBED] = torch.zeros(3, 64)
    expected = f"parameter '{EMBED}' has shape [3, 64], the rollout model expects [101, 64]"
    with pytest.raises(WeightUpdateError, match=re.escape(expected)):
        engine.update_weights(update, version=1)
    assert engine.version == 0


def test_strict_update_requires_every_parameter_but_partial_is_allowed_when_not_strict(tok):
    model = make_model(tok, 0)
    engine = RolloutEngine(model, tok)
    new_embed = torch.zeros_like(model.model.embed_tokens.weight)
    with pytest.raises(WeightUpdateError, match=r"parameter\(s\) missing from the update \(strict\)"):
        engine.update_weights({EMBED: new_embed}, version=1)
    engine.update_weights({EMBED: new_embed}, version=1, strict=False)
    assert engine.version == 1 and torch.equal(model.model.embed_tokens.weight, new_embed)


def test_update_weights_during_generate_is_refused(tok):
    model = make_model(tok, 0)
    engine = RolloutEngine(model, tok)
    errors = []

    def hook(module, inputs, output):
        try:
            engine.update_weights(engine.state_dict_for_sync(), version=9)
        except EngineBusyError as e:
            errors.append(str(e))

    model.register_forward_hook(hook)
    engine.generate(make_prompts(tok), SamplingParams(max_new_tokens=2), seed=0)
    assert errors and "while a generate/resume is running" in errors[0]
    assert engine.version == 0
    engine.update_weights(engine.state_dict_for_sync(), version=9)  # idle again: accepted
    assert engine.version == 9
