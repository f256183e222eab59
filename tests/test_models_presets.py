"""Qwen2 presets: sizes, determinism, and the plain HF directory written by init_model_dir."""

import json
import string

import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncrl.models.loading import eos_token_ids, load_model
from asyncrl.models.presets import PRESETS, build_model, count_parameters, init_model_dir
from asyncrl.models.tokenizer import build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    tok = build_char_tokenizer([string.printable[:94]])
    assert len(tok) == 100  # the vocabulary the preset sizes are quoted for (6 special tokens + 94 characters)
    return tok


def test_tiny_preset_has_about_4_2m_parameters(tok):
    assert 4.0e6 <= count_parameters(build_model("tiny", tok, seed=0)) <= 4.4e6


def test_small_preset_is_a_15_to_25m_teacher(tok):
    assert 15e6 <= count_parameters(build_model("small", tok, seed=0)) <= 25e6


def test_preset_takes_vocab_and_special_ids_from_the_tokenizer(tok):
    model = build_model("micro", tok, seed=0)
    assert model.config.vocab_size == len(tok)
    assert model.config.eos_token_id == tok.eos_token_id
    assert model.config.pad_token_id == tok.pad_token_id
    assert model.config.max_position_embeddings == 512
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied


def test_overrides_replace_preset_fields(tok):
    model = build_model("micro", tok, seed=0, num_hidden_layers=1)
    assert model.config.num_hidden_layers == 1


def test_same_seed_gives_same_weights_and_leaves_global_rng_alone(tok):
    torch.manual_seed(123)
    expected_draw = torch.rand(1)
    torch.manual_seed(123)
    a = build_model("micro", tok, seed=7)
    assert torch.equal(torch.rand(1), expected_draw)
    b = build_model("micro", tok, seed=7)
    c = build_model("micro", tok, seed=8)
    assert torch.equal(a.model.embed_tokens.weight, b.model.embed_tokens.weight)
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


def test_unknown_preset_error_lists_known_presets(tok):
    with pytest.raises(ValueError, match="'huge' is unknown") as info:
        build_model("huge", tok, seed=0)
    for name in PRESETS:
        assert name in str(info.value)


def test_init_model_dir_writes_a_plain_hf_directory_that_loads_back(tok, tmp_path):
    out = tmp_path / "tiny"
    model = init_model_dir("micro", tok, out, seed=3)
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= files
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen2"

    loaded, loaded_tok = load_model(out, for_training=False)
    plain = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    ids = torch.tensor([tok.encode("hello world")])
    model.eval()
    with torch.no_grad():
        expected = model(ids).logits
        torch.testing.assert_close(loaded(ids).logits, expected)
        torch.testing.assert_close(plain(ids).logits, expected)
    assert loaded_tok.encode("hello") == tok.encode("hello")
    assert loaded_tok.chat_template == tok.chat_template
    assert eos_token_ids(loaded, loaded_tok) == [tok.eos_token_id]
