"""Small tokenizers built from scratch, for tiny models trained in tests and toy experiments.

No tokenizer is ever downloaded: the character tokenizer has one token per distinct character seen in ``texts`` (so a
model over it has a vocabulary of ~100 and the "tiny" preset stays ~4M parameters), the byte-level BPE tokenizer is
trained on ``texts`` with the ``tokenizers`` library. Both share the same special tokens and chat template, so prompts
rendered for one render identically (as text) for the other.

Chat format (one conversation, as text)::

    <|user|>What is 2+2?<|end|><|assistant|>4<|end|>

and a tool's output, in a multi-turn rollout: ``<|tool|>{output}<|end|>``.

A prompt rendered with ``add_generation_prompt=True`` ends with ``<|assistant|>``; the model's response is then
``{content}<|end|>``, so ``<|end|>`` is the eos token the rollout engine stops on.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

PAD_TOKEN = "<|pad|>"
UNK_TOKEN = "<|unk|>"
USER_TOKEN = "<|user|>"
ASSISTANT_TOKEN = "<|assistant|>"
END_TOKEN = "<|end|>"
TOOL_TOKEN = "<|tool|>"  # opens a tool's output in a multi-turn conversation (asyncrl.rollout.agent)
SPECIAL_TOKENS: list[str] = [PAD_TOKEN, UNK_TOKEN, USER_TOKEN, ASSISTANT_TOKEN, END_TOKEN, TOOL_TOKEN]

# System messages have no role token of their own: their text is prepended, closed by <|end|>, so a system prompt is
# still visible to the model without growing the vocabulary. Unknown roles are an error rather than silently dropped.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}"
    "<|user|>{{ message['content'] }}<|end|>"
    "{%- elif message['role'] == 'assistant' -%}"
    "<|assistant|>{{ message['content'] }}<|end|>"
    "{%- elif message['role'] == 'tool' -%}"
    "<|tool|>{{ message['content'] }}<|end|>"
    "{%- elif message['role'] == 'system' -%}"
    "{{ message['content'] }}<|end|>"
    "{%- else -%}"
    "{{ raise_exception('chat template: unknown role ' ~ message['role'] ~ "
    "' (expected user, assistant, tool or system)') }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)


def _wrap(backend: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a ``tokenizers.Tokenizer`` as a transformers tokenizer with our special tokens and chat template."""
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        eos_token=END_TOKEN,
        bos_token=None,
        additional_special_tokens=[USER_TOKEN, ASSISTANT_TOKEN, TOOL_TOKEN],
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_char_tokenizer(texts: Iterable[str]) -> PreTrainedTokenizerFast:
    """One token per distinct character in ``texts`` (sorted, after the 6 special tokens, which take ids 0..5).

    Every character (spaces and newlines included) is its own pre-token, and the decoder concatenates tokens without
    separators, so ``decode(encode(t)) == t`` for any ``t`` made of seen characters; unseen ones become ``<|unk|>``.
    """
    chars = sorted({c for text in texts for c in text})
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for c in chars:
        vocab.setdefault(c, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(SPECIAL_TOKENS)
    return _wrap(backend)


def build_bpe_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on ``texts`` with at most ``vocab_size`` tokens (special tokens and 256 bytes included).

    Byte-level means any text round-trips, seen characters or not.
    """
    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(
            f"build_bpe_tokenizer: vocab_size {vocab_size} is too small "
            f"(need at least {len(SPECIAL_TOKENS) + 256}: special tokens plus the 256 byte tokens)"
        )
    backend = Tokenizer(models.BPE(unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    return _wrap(backend)


def save_tokenizer(tok: PreTrainedTokenizerFast, out_dir: str | os.PathLike[str]) -> None:
    """Save in Hugging Face format (tokenizer.json + tokenizer_config.json with the chat template) to ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    tok.save_pretrained(str(out_dir))


def load_tokenizer(path: str | os.PathLike[str]) -> PreTrainedTokenizerFast:
    """Load a tokenizer saved by :func:`save_tokenizer` (or any local HF tokenizer directory), never from a hub."""
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
