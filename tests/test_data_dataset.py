"""PromptDataset: chat-template tokenisation with a real (locally built) tokenizer and max_prompt_length handling."""

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from asyncrl.data.dataset import PromptDataset, tokenize_messages
from asyncrl.data.rows import DatasetError, load_rows, write_rows
from asyncrl.types import Prompt

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
WORDS = "what is one two three plus minus ? be brief".split()


@pytest.fixture(scope="module")
def tokenizer():
    """Word-level tokenizer: one token per whitespace-separated word, so prompt lengths are easy to count."""
    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "<|system|>": 3, "<|user|>": 4, "<|assistant|>": 5}
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", bos_token="<s>", eos_token="</s>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _row(content, i=0):
    return {
        "data_source": "chain_sum",
        "prompt": [{"role": "user", "content": content}],
        "reward_model": {"style": "rule", "ground_truth": str(i)},
        "extra_info": {"index": i},
    }


def test_prompts_are_tokenised_with_the_chat_template(tokenizer):
    rows = [_row("what is one plus two ?", 3), _row("what is three minus one ?", 2)]

    dataset = PromptDataset(rows, tokenizer, max_prompt_length=16)

    vocab = tokenizer.get_vocab()
    expected = [vocab[t] for t in "<|user|> what is one plus two ? <|assistant|>".split()]
    assert len(dataset) == 2
    assert dataset[0] == Prompt(
        index=0, prompt_ids=expected, data_source="chain_sum", ground_truth="3", extra_info={"index": 3}
    )
    assert dataset[1].index == 1 and dataset[1].ground_truth == "2"
    assert dataset.max_length() == 8


def test_batch_encoding_and_plain_list_returns_give_the_same_ids(tokenizer):
    messages = [{"role": "user", "content": "what is one ?"}]
    as_list = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)

    assert tokenize_messages(tokenizer, messages) == list(as_list)


def test_without_chat_template_contents_are_encoded_plainly(tokenizer):
    dataset = PromptDataset([_row("what is one ?")], tokenizer, max_prompt_length=16, apply_chat_template=False)

    assert dataset[0].prompt_ids == tokenizer("what is one ?", add_special_tokens=True)["input_ids"]


def test_overlong_prompt_error_names_file_row_and_lengths(tokenizer, tmp_path):
    path = write_rows(tmp_path / "train.parquet", [_row("one"), _row("one two three plus one two three"), _row("one")])

    with pytest.raises(DatasetError) as info:
        PromptDataset(load_rows(path), tokenizer, max_prompt_length=5)

    message = str(info.value)
    assert message.startswith(f"{path} row 1: prompt is 9 tokens, longer than max_prompt_length=5")
    assert "1 of 3 rows are too long" in message


def test_overlong_prompts_can_be_filtered_and_are_counted(tokenizer):
    rows = [_row("one", 0), _row("one two three plus one two three", 1), _row("two", 2)]

    dataset = PromptDataset(rows, tokenizer, max_prompt_length=5, overlong="filter")

    assert len(dataset) == 2
    assert dataset.num_filtered == 1 and dataset.filtered_indices == [1]
    assert [dataset[i].index for i in range(2)] == [0, 2]  # row indices survive filtering


@pytest.mark.parametrize("side", ["truncate_left", "truncate_right"])
def test_overlong_prompts_can_be_truncated_from_either_side(tokenizer, side):
    rows = [_row("one", 0), _row("one two three plus one two three", 1)]
    whole = PromptDataset(rows, tokenizer, max_prompt_length=64)[1].prompt_ids

    dataset = PromptDataset(rows, tokenizer, max_prompt_length=5, overlong=side)

    assert len(dataset) == 2 and dataset.truncated_indices == [1] and dataset.num_filtered == 0
    assert dataset[1].prompt_ids == (whole[-5:] if side == "truncate_left" else whole[:5])
    assert dataset[0].prompt_ids == PromptDataset(rows[:1], tokenizer, max_prompt_length=5)[0].prompt_ids


def test_filtering_every_prompt_is_an_error(tokenizer):
    with pytest.raises(DatasetError, match="all 1 prompts are longer than max_prompt_length=2"):
        PromptDataset([_row("one two three")], tokenizer, max_prompt_length=2, overlong="filter")


def test_get_returns_independent_prompts_tagged_with_epoch(tokenizer):
    dataset = PromptDataset([_row("one")], tokenizer, max_prompt_length=8)

    p = dataset.get(0, epoch=3)
    p.extra_info["touched"] = 1

    assert p.uid == "3:0"
    assert dataset[0].epoch == 0 and "touched" not in dataset[0].extra_info


def test_rows_built_in_code_are_validated(tokenizer):
    with pytest.raises(DatasetError, match="<rows> row 0: missing 'reward_model.ground_truth'"):
        PromptDataset([{"data_source": "x", "prompt": "one", "reward_model": {}}], tokenizer, max_prompt_length=8)


def test_tokenizer_without_chat_template_is_refused(tokenizer):
    plain = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, unk_token="[UNK]")

    with pytest.raises(ValueError, match="has no chat_template"):
        PromptDataset([_row("one")], plain, max_prompt_length=8)


def test_from_files_loads_and_tokenises(tokenizer, tmp_path):
    path = write_rows(tmp_path / "d.jsonl", [_row("one"), _row("two", 1)])

    dataset = PromptDataset.from_files([path], tokenizer, max_prompt_length=8)

    assert [p.ground_truth for p in (dataset[0], dataset[1])] == ["0", "1"]
