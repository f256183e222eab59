"""Built-in reasoning-gym tasks: verl row schema, determinism, and disjoint train/test splits."""

import json

import pyarrow.parquet as pq
import pytest

from asyncrl.data.rows import load_rows
from asyncrl.data.tasks import TASKS, get_task, make_rows, register_task, write_task_dataset


def test_chain_sum_rows_follow_the_verl_schema():
    rows = make_rows("chain_sum", 4, seed=7, split="train")

    assert len(rows) == 4
    for i, row in enumerate(rows):
        assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        assert row["data_source"] == "chain_sum"
        assert row["ability"] == "math"
        assert row["prompt"] == [{"role": "user", "content": row["extra_info"]["question"]}]
        assert row["prompt"][0]["content"].startswith("State the final answer to the following arithmetic problem:")
        assert row["reward_model"] == {"style": "rule", "ground_truth": row["extra_info"]["answer"]}
        info = row["extra_info"]
        assert (info["split"], info["index"]) == ("train", i)
        assert json.loads(info["task_kwargs"]) == dict(TASKS["chain_sum"].defaults)
        assert json.loads(info["metadata"])["source_index"] == i
        assert all(isinstance(v, str | int) for v in info.values())  # flat and parquet-friendly


def test_same_seed_gives_same_rows_and_other_seed_differs():
    assert make_rows("basic_arithmetic", 5, seed=3, split="train") == make_rows("basic_arithmetic", 5, 3, "train")
    assert make_rows("basic_arithmetic", 5, seed=3, split="train") != make_rows("basic_arithmetic", 5, 4, "train")


def test_task_kwargs_override_defaults_and_are_recorded():
    rows = make_rows("chain_sum", 20, seed=0, split="train", min_terms=5, max_terms=5, max_digits=1)

    for row in rows:
        assert json.loads(row["extra_info"]["metadata"])["num_terms"] == 5
        assert json.loads(row["extra_info"]["task_kwargs"])["max_terms"] == 5


def test_countdown_metadata_keeps_numbers_and_target():
    row = make_rows("countdown", 1, seed=1, split="train")[0]

    metadata = json.loads(row["extra_info"]["metadata"])
    assert isinstance(metadata["numbers"], list) and isinstance(metadata["target"], int)
    assert str(metadata["target"]) in row["prompt"][0]["content"]


def test_unknown_task_error_lists_known_tasks():
    with pytest.raises(ValueError, match="unknown task 'chain_summ'") as info:
        make_rows("chain_summ", 1, seed=0, split="train")
    assert "chain_sum" in str(info.value) and "countdown" in str(info.value)


def test_bad_task_kwarg_names_task_and_allowed_fields():
    with pytest.raises(ValueError, match="task 'chain_sum': unknown kwargs \\['max_term'\\]") as info:
        make_rows("chain_sum", 1, seed=0, split="train", max_term=3)
    assert "max_terms" in str(info.value)


def test_invalid_task_kwarg_value_names_task():
    with pytest.raises(ValueError, match="task 'chain_sum': invalid kwargs"):
        make_rows("chain_sum", 1, seed=0, split="train", min_terms=5, max_terms=2)


def test_any_reasoning_gym_dataset_works_and_register_task_adds_defaults():
    assert get_task("gcd").defaults == {}
    try:
        register_task("gcd", {"min_numbers": 2, "max_numbers": 2})
        row = make_rows("gcd", 1, seed=0, split="train")[0]
        assert json.loads(row["extra_info"]["task_kwargs"]) == {"min_numbers": 2, "max_numbers": 2}
    finally:
        TASKS.pop("gcd")


def test_write_task_dataset_splits_are_disjoint_and_test_has_requested_size(tmp_path):
    # 1-digit sums of 2 terms have only ~200 distinct questions: the training split must skip the test's 50.
    small = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    train_path, test_path = write_task_dataset("chain_sum", 100, seed=0, out_dir=tmp_path, test_size=50, **small)

    assert (train_path, test_path) == (tmp_path / "train.parquet", tmp_path / "test.parquet")
    train, test = load_rows(train_path), load_rows(test_path)
    train_questions = {r["extra_info"]["question"] for r in train}
    test_questions = [r["extra_info"]["question"] for r in test]
    assert len(train) == 100 and len(test) == 50
    assert len(set(test_questions)) == 50
    assert not train_questions & set(test_questions)
    assert [r["extra_info"]["index"] for r in test] == list(range(50))
    assert {r["extra_info"]["split"] for r in test} == {"test"}
    assert pq.read_table(test_path).num_rows == 50


def test_write_task_dataset_test_split_keeps_the_tasks_distribution(tmp_path):
    # Mixed difficulty: ~1/4 of chain_sum items are 2-term 1-digit sums, whose ~200 questions a 2,000-row training split
    # covers almost entirely. The test split is drawn first, so those easy items stay in it (a test that skipped every
    # question seen in training would have none), and training skips them instead.
    mixed = {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}
    train_path, test_path = write_task_dataset("chain_sum", 2000, seed=0, out_dir=tmp_path, test_size=200, **mixed)
    train, test = load_rows(train_path), load_rows(test_path)
    assert len(train) == 2000 and len(test) == 200
    assert not {r["extra_info"]["question"] for r in train} & {r["extra_info"]["question"] for r in test}

    def easy(r):
        m = json.loads(r["extra_info"]["metadata"])
        return m["num_terms"] == 2 and m["num_digits"] == 1

    assert 0.10 < sum(map(easy, test)) / len(test) < 0.40


def test_write_task_dataset_raises_when_question_space_is_too_small(tmp_path):
    tiny = {"min_terms": 1, "max_terms": 1, "min_digits": 1, "max_digits": 1}  # 10 possible questions
    with pytest.raises(ValueError, match="only .* of 50 test questions are distinct"):
        write_task_dataset("chain_sum", 20, seed=0, out_dir=tmp_path, test_size=50, **tiny)
    # A test split that takes every question leaves nothing for training: also an error, not a silently short split.
    with pytest.raises(ValueError, match="only 0 of 20 training items avoid the 10 test questions"):
        write_task_dataset("chain_sum", 20, seed=0, out_dir=tmp_path, test_size=10, **tiny)
