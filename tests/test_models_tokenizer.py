"""Char and byte-level BPE tokenizers: round trips, special tokens, chat template, save/load in HF format."""

import string

import pytest
from transformers import AutoTokenizer

from asyncrl.models.tokenizer import (
    ASSISTANT_TOKEN,
    END_TOKEN,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    TOOL_TOKEN,
    USER_TOKEN,
    build_bpe_tokenizer,
    build_char_tokenizer,
    save_tokenizer,
)

CORPUS = [string.printable[:95], "What is 12 + 30?\nThe answer is 42.\t"]
CONVERSATION = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]


@pytest.fixture(scope="module")
def char_tok():
    return build_char_tokenizer(CORPUS)


def test_char_tokenizer_round_trips_text_with_spaces_and_newlines(char_tok):
    text = "  a  b\n\tc d  "
    ids = char_tok.encode(text)
    assert len(ids) == len(text)  # one token per character
    assert char_tok.decode(ids) == text


def test_char_tokenizer_maps_unseen_characters_to_unk(char_tok):
    assert char_tok.encode("aé") == [char_tok.convert_tokens_to_ids("a"), char_tok.unk_token_id]


def test_char_tokenizer_has_the_special_tokens_as_single_ids(char_tok):
    assert char_tok.eos_token == END_TOKEN and char_tok.pad_token == PAD_TOKEN
    assert char_tok.eos_token_id != char_tok.pad_token_id
    for special in (USER_TOKEN, ASSISTANT_TOKEN, END_TOKEN, TOOL_TOKEN):
        assert len(char_tok.encode(special)) == 1
    assert len(char_tok) == len(SPECIAL_TOKENS) + len(set("".join(CORPUS)))


def test_decode_skips_special_tokens_when_asked(char_tok):
    ids = char_tok.encode(f"{USER_TOKEN}hi{END_TOKEN}")
    assert char_tok.decode(ids, skip_special_tokens=True) == "hi"


def test_chat_template_renders_turns_and_generation_prompt(char_tok):
    rendered = char_tok.apply_chat_template(CONVERSATION, tokenize=False)
    assert rendered == "<|user|>2+2?<|end|><|assistant|>4<|end|>"
    prompt = char_tok.apply_chat_template(CONVERSATION[:1], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|user|>2+2?<|end|><|assistant|>"
    assert rendered.startswith(prompt)  # the response the model must produce is exactly "4<|end|>"


def test_chat_template_tokenizes_special_tokens_as_single_ids(char_tok):
    ids = char_tok.apply_chat_template(CONVERSATION[:1], add_generation_prompt=True)["input_ids"]
    assert ids[0] == char_tok.convert_tokens_to_ids(USER_TOKEN)
    assert ids[-1] == char_tok.convert_tokens_to_ids(ASSISTANT_TOKEN)
    assert len(ids) == 1 + len("2+2?") + 2


def test_chat_template_rejects_unknown_roles(char_tok):
    with pytest.raises(Exception, match="unknown role ipython"):
        char_tok.apply_chat_template([{"role": "ipython", "content": "x"}], tokenize=False)


def test_chat_template_renders_a_tool_message_as_its_own_turn(char_tok):
    conversation = CONVERSATION + [{"role": "tool", "content": "4"}]
    text = char_tok.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|end|><|tool|>4<|end|><|assistant|>")


def test_saved_char_tokenizer_loads_back_with_auto_tokenizer(char_tok, tmp_path):
    save_tokenizer(char_tok, tmp_path / "tok")
    loaded = AutoTokenizer.from_pretrained(str(tmp_path / "tok"), local_files_only=True)
    text = "What is 12 + 30?\n"
    assert loaded.encode(text) == char_tok.encode(text)
    assert loaded.decode(loaded.encode(text)) == text
    assert loaded.eos_token == END_TOKEN and loaded.pad_token == PAD_TOKEN
    assert loaded.apply_chat_template(CONVERSATION, tokenize=False) == "<|user|>2+2?<|end|><|assistant|>4<|end|>"


def test_bpe_tokenizer_round_trips_unseen_unicode_and_respects_vocab_size(tmp_path):
    tok = build_bpe_tokenizer(CORPUS * 20, vocab_size=300)
    assert len(tok) <= 300
    text = "héllo wörld 你好 12+30"
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(f"{USER_TOKEN}x{END_TOKEN}")) == 3
    save_tokenizer(tok, tmp_path / "bpe")
    loaded = AutoTokenizer.from_pretrained(str(tmp_path / "bpe"), local_files_only=True)
    assert loaded.encode(text) == tok.encode(text)
    prompt = loaded.apply_chat_template(CONVERSATION[:1], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|user|>2+2?<|end|><|assistant|>"


def test_bpe_tokenizer_rejects_a_vocab_smaller_than_the_byte_alphabet():
    with pytest.raises(ValueError, match="vocab_size 100 is too small"):
        build_bpe_tokenizer(CORPUS, vocab_size=100)
