"""load_model: clear errors for unusable directories, train/eval modes, eos ids, seeding."""

import json
import random
import re
import string

import numpy as np
import pytest
import torch
from transformers import GenerationConfig

from asyncrl.models.loading import ModelLoadError, eos_token_ids, load_model, set_seed_all
from asyncrl.models.presets import build_model, init_model_dir
from asyncrl.models.tokenizer import build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer([string.printable[:95]])


@pytest.fixture(scope="module")
def model_dir(tok, tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "micro"
    init_model_dir("micro", tok, out, seed=0)
    return out


def _write_config(directory, config):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_missing_path_is_named_in_the_error(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ModelLoadError, match=re.escape(f"model.path {missing}: does not exist")):
        load_model(missing)


def test_file_instead_of_directory_is_rejected(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="is a file, not a directory"):
        load_model(path)


def test_directory_without_config_json_is_rejected(tmp_path):
    with pytest.raises(
        ModelLoadError, match=re.escape(f"model.path {tmp_path}: no config.json (expected a Hugging Face")
    ):
        load_model(tmp_path)


def test_bogus_model_type_is_rejected_by_name(tmp_path):
    path = _write_config(tmp_path / "bogus", {"model_type": "definitely_not_a_model"})
    with pytest.raises(ModelLoadError, match=r"model_type 'definitely_not_a_model' is not an architecture"):
        load_model(path)


def test_config_without_model_type_is_rejected(tmp_path):
    path = _write_config(tmp_path / "untyped", {"hidden_size": 8})
    with pytest.raises(ModelLoadError, match="config.json has no model_type"):
        load_model(path)


def test_non_causal_architecture_is_rejected(tmp_path):
    path = _write_config(tmp_path / "t5", {"model_type": "t5"})
    with pytest.raises(ModelLoadError, match=r"model_type 't5' is not a causal language model"):
        load_model(path)


def test_invalid_json_config_is_rejected(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="config.json is not valid JSON"):
        load_model(tmp_path)


def test_tokenizer_without_eos_is_rejected(tok, tmp_path):
    out = tmp_path / "noeos"
    init_model_dir("micro", tok, out, seed=0)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["eos_token"] = None
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="tokenizer has no eos token"):
        load_model(out)


def test_missing_weights_are_reported_with_the_path(tok, tmp_path):
    out = tmp_path / "noweights"
    init_model_dir("micro", tok, out, seed=0)
    (out / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=re.escape(f"model.path {out}: could not load the model weights")):
        load_model(out)


def test_unknown_dtype_is_rejected(model_dir):
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        load_model(model_dir, dtype="float8")


def test_load_for_training_or_inference_sets_mode_and_grads(model_dir):
    train_model, _ = load_model(model_dir, for_training=True)
    assert train_model.training and all(p.requires_grad for p in train_model.parameters())
    infer_model, _ = load_model(model_dir, dtype="bfloat16", for_training=False)
    assert not infer_model.training and not any(p.requires_grad for p in infer_model.parameters())
    assert infer_model.dtype == torch.bfloat16


def test_eos_token_ids_unions_tokenizer_and_generation_config(tok):
    model = build_model("micro", tok, seed=0)
    model.generation_config = GenerationConfig(eos_token_id=[7, tok.eos_token_id])
    assert eos_token_ids(model, tok) == sorted({7, tok.eos_token_id})


def test_set_seed_all_makes_python_numpy_and_torch_repeatable():
    set_seed_all(5)
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    set_seed_all(5)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def test_char_tokenizer_in_a_model_dir_keeps_spaces_newlines_and_unknowns(tmp_path):
    """Regression: AutoTokenizer picked Qwen2Tokenizer for a Qwen2 dir and silently dropped spaces and newlines."""
    from asyncrl.models.loading import load_model
    from asyncrl.models.presets import init_model_dir
    from asyncrl.models.tokenizer import build_char_tokenizer

    built = build_char_tokenizer(["0123456789 +-=#\n"])
    init_model_dir("micro", built, tmp_path / "m", seed=0)
    _, loaded = load_model(tmp_path / "m")
    text = "12 + 3 = é\n#### 15"
    assert loaded(text)["input_ids"] == built(text)["input_ids"]
    assert loaded.decode(loaded(text)["input_ids"]) == "12 + 3 = <|unk|>\n#### 15"
    loaded.save_pretrained(tmp_path / "again")  # a re-saved tokenizer must load the same way
    from asyncrl.models.loading import load_tokenizer_from

    again = load_tokenizer_from(str(tmp_path / "again"))
    assert again(text)["input_ids"] == built(text)["input_ids"]
