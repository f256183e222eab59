"""Reading data files: round trips, validation errors that name file and row, multiple files."""

import json

import pytest

from asyncrl.data.rows import DatasetError, Rows, load_rows, validate_row, write_rows


def _row(i: int, **changes):
    row = {
        "data_source": "chain_sum",
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"What is {i} + 1?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
        "extra_info": {"split": "train", "index": i},
    }
    row.update(changes)
    return row


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".json"])
def test_rows_round_trip_through_each_format(tmp_path, suffix):
    rows = [_row(i) for i in range(3)]
    path = write_rows(tmp_path / f"data{suffix}", rows)

    loaded = load_rows(path)

    assert loaded == rows
    assert loaded.origins == [(str(path), 0), (str(path), 1), (str(path), 2)]


def test_json_file_may_hold_a_top_level_array(tmp_path):
    path = tmp_path / "data.json"
    path.write_text(json.dumps([_row(0), _row(1)]))

    assert [r["reward_model"]["ground_truth"] for r in load_rows(path)] == ["1", "2"]


def test_several_files_are_concatenated_in_order_and_keep_their_row_numbers(tmp_path):
    a = write_rows(tmp_path / "a.parquet", [_row(0), _row(1)])
    b = _write_jsonl(tmp_path / "b.jsonl", [_row(2)])

    rows = load_rows([a, str(b)])

    assert [r["reward_model"]["ground_truth"] for r in rows] == ["1", "2", "3"]
    assert rows.where(2) == f"{b} row 0"


def test_string_prompt_becomes_one_user_message_and_numeric_ground_truth_a_string():
    row = validate_row(_row(0, prompt="What is 2 + 2?", reward_model={"ground_truth": 4}, extra_info=None), "x")

    assert row["prompt"] == [{"role": "user", "content": "What is 2 + 2?"}]
    assert row["reward_model"]["ground_truth"] == "4"
    assert row["extra_info"] == {}


def test_parquet_null_placeholders_in_messages_are_dropped(tmp_path):
    # parquet gives every message every key of its column: the user message gets "name": None
    rows = [_row(0, prompt=[{"role": "system", "content": "hi", "name": "sys"}, {"role": "user", "content": "q"}])]
    loaded = load_rows(write_rows(tmp_path / "d.parquet", rows))

    assert loaded[0]["prompt"][1] == {"role": "user", "content": "q"}


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        ({k: v for k, v in _row(0).items() if k != "prompt"}, "row 1: missing 'prompt'"),
        (_row(0, prompt=[]), "row 1: 'prompt' is an empty list"),
        (_row(0, prompt=["hello"]), "row 1: 'prompt[0]' must be a dict with 'role' and 'content' (got str)"),
        (_row(0, prompt=[{"content": "hello"}]), "row 1: 'prompt[0]' has no 'role'"),
        (_row(0, prompt=[{"role": 3, "content": "hi"}]), "row 1: 'prompt[0].role' must be a non-empty string"),
        (
            _row(0, prompt=[{"role": "user", "content": ["a"]}]),
            "row 1: 'prompt[0].content' must be a string (got list)",
        ),
        (_row(0, prompt=7), "row 1: 'prompt' must be a list of chat messages or a string (got int)"),
        (_row(0, reward_model={"style": "rule"}), "row 1: missing 'reward_model.ground_truth'"),
        (
            _row(0, reward_model={"ground_truth": ["1"]}),
            "row 1: 'reward_model.ground_truth' must be a string (got list)",
        ),
        (
            _row(0, reward_model={"ground_truth": True}),
            "row 1: 'reward_model.ground_truth' must be a string (got bool)",
        ),
        ({k: v for k, v in _row(0).items() if k != "reward_model"}, "row 1: missing 'reward_model'"),
        (_row(0, data_source=5), "row 1: 'data_source' must be a non-empty string (got 5)"),
        (_row(0, extra_info="x"), "row 1: 'extra_info' must be a dict (got str)"),
    ],
)
def test_bad_row_error_names_file_row_and_problem(tmp_path, bad_row, message):
    path = _write_jsonl(tmp_path / "train.jsonl", [_row(0), bad_row])

    with pytest.raises(DatasetError) as info:
        load_rows(path)

    assert str(info.value).startswith(f"{path} {message}")


def test_bad_row_in_parquet_names_file_and_row(tmp_path):
    path = write_rows(tmp_path / "train.parquet", [_row(0), _row(1), _row(2, data_source=None)])

    with pytest.raises(DatasetError, match=r"train\.parquet row 2: missing 'data_source'"):
        load_rows(path)


def test_invalid_json_line_names_the_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(_row(0)) + "\n\n{not json\n")

    with pytest.raises(DatasetError, match=r"d\.jsonl line 3: invalid JSON"):
        load_rows(path)


def test_missing_file_and_unknown_extension_are_named(tmp_path):
    with pytest.raises(DatasetError, match=r"nope\.parquet: no such file"):
        load_rows(tmp_path / "nope.parquet")
    with pytest.raises(
        DatasetError, match=r"d\.csv: unsupported file type '\.csv' \(allowed: \.parquet, \.jsonl, \.json\)"
    ):
        load_rows(tmp_path / "d.csv")


def test_corrupt_parquet_is_reported_with_its_path(tmp_path):
    path = tmp_path / "d.parquet"
    path.write_bytes(b"not parquet at all")

    with pytest.raises(DatasetError, match=r"d\.parquet: cannot read as parquet"):
        load_rows(path)


def test_rows_built_in_code_get_generic_locations():
    rows = Rows([_row(0), _row(1)])

    assert rows.where(1) == "<rows> row 1"
    with pytest.raises(ValueError, match="2 rows but 1 origins"):
        Rows([_row(0), _row(1)], origins=[("a", 0)])
