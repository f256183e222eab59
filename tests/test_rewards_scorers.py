"""Built-in scorers through the data_source registry: reasoning-gym tasks and math-verify."""

import json
import threading

import pytest

from asyncrl.data.tasks import make_rows
from asyncrl.rewards.registry import (
    MATH_DATA_SOURCES,
    UnknownDataSourceError,
    get_scorer,
    known_data_sources,
    register_scorer,
    unregister_scorer,
)
from asyncrl.rewards.scorers import math_verify_score, reasoning_gym_score


def _score(row, response):
    source, truth = row["data_source"], row["reward_model"]["ground_truth"]
    return get_scorer(source)(source, response, truth, row["extra_info"])


@pytest.fixture(scope="module")
def chain_sum_row():
    return make_rows("chain_sum", 1, seed=5, split="train")[0]


@pytest.fixture(scope="module")
def countdown_row():
    return make_rows("countdown", 1, seed=0, split="train")[0]


def test_chain_sum_correct_answer_scores_one_and_wrong_scores_zero(chain_sum_row):
    truth = chain_sum_row["reward_model"]["ground_truth"]
    wrong = str(int(truth) + 1)
    assert truth not in wrong  # else reasoning-gym gives partial credit

    assert _score(chain_sum_row, truth) == 1.0
    assert _score(chain_sum_row, f"Adding up...\n<answer>{truth}</answer>") == 1.0
    assert _score(chain_sum_row, wrong) == 0.0


def test_chain_sum_gives_reasoning_gym_partial_credit_when_the_answer_is_contained(chain_sum_row):
    truth = chain_sum_row["reward_model"]["ground_truth"]

    # reasoning-gym's rule: len(truth) / len(answer) if the truth is a substring of a wrong answer
    assert _score(chain_sum_row, truth + "0") == pytest.approx(len(truth) / (len(truth) + 1))


def test_basic_arithmetic_uses_its_own_score_answer():
    row = make_rows("basic_arithmetic", 1, seed=1, split="train")[0]

    assert _score(row, row["reward_model"]["ground_truth"]) == 1.0
    assert _score(row, "no idea") == 0.0


def test_countdown_accepts_any_expression_using_the_numbers_that_hits_the_target(countdown_row):
    metadata = json.loads(countdown_row["extra_info"]["metadata"])
    numbers, target = metadata["numbers"], metadata["target"]
    assert (numbers, target) == ([10, 40, 13, 10], 520)  # seed 0 gives this puzzle

    assert _score(countdown_row, "<answer>(13 * 40) + 10 - 10</answer>") == 1.0
    assert _score(countdown_row, "13 * 40") == 0.05  # right value, not all numbers: countdown's "format" credit
    assert _score(countdown_row, "10 * 40 + 13 + 10") == 0.05  # all numbers, wrong value


def test_countdown_refuses_power_and_factorial_without_evaluating_them(countdown_row):
    # sympy would hang on 9**9**9**9; countdown allows only + - * /
    assert _score(countdown_row, "9**9**9**9") == 0.01
    assert _score(countdown_row, "100000!") == 0.01


def test_countdown_without_metadata_is_an_error_not_a_zero(countdown_row):
    extra = {k: v for k, v in countdown_row["extra_info"].items() if k != "metadata"}

    with pytest.raises(ValueError, match=r"'countdown': scoring needs extra_info\['metadata'\] with keys"):
        reasoning_gym_score("countdown", "1", "1", extra)


def test_reasoning_gym_scorer_works_for_rows_without_extra_info():
    assert reasoning_gym_score("chain_sum", "<answer>12</answer>", "12", {}) == 1.0


@pytest.mark.parametrize(
    ("truth", "response", "expected"),
    [
        ("\\frac{1}{2}", "0.5", 1.0),
        ("0.5", "<answer>\\frac{1}{2}</answer>", 1.0),
        ("72", "She has 72 apples.\n#### 72", 1.0),
        ("3", "Thus the result is \\boxed{3}. Done, 5 steps.", 1.0),
        ("\\frac{1}{2}", "0.6", 0.0),
        ("72", "", 0.0),
    ],
)
def test_math_verify_scores_equivalent_forms(truth, response, expected):
    assert get_scorer("math")("math", response, truth, {}) == expected


def test_math_verify_works_outside_the_main_thread():
    results = []
    thread = threading.Thread(target=lambda: results.append(math_verify_score("math", "0.5", "\\frac{1}{2}", {})))
    thread.start()
    thread.join()

    assert results == [1.0]


def test_gsm8k_sources_use_math_verify():
    assert {"openai/gsm8k", "gsm8k", "math"} <= MATH_DATA_SOURCES
    assert get_scorer("openai/gsm8k") is math_verify_score


def test_unknown_data_source_error_names_it_and_the_known_ones():
    with pytest.raises(UnknownDataSourceError) as info:
        get_scorer("my_dataset")

    message = str(info.value)
    assert message.startswith("no reward scorer for data_source 'my_dataset'")
    assert "openai/gsm8k" in message and "chain_sum" in message


def test_registered_scorer_takes_precedence_and_refuses_silent_replacement():
    def always_one(data_source, solution_str, ground_truth, extra_info):
        return 1.0

    register_scorer("chain_sum", always_one)
    try:
        assert get_scorer("chain_sum") is always_one
        assert "chain_sum" in known_data_sources()
        with pytest.raises(ValueError, match="a scorer for 'chain_sum' exists already"):
            register_scorer("chain_sum", always_one)
    finally:
        unregister_scorer("chain_sum")
    assert get_scorer("chain_sum") is reasoning_gym_score


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("4 + 7 = 11", "11", 1.0),
        ("Answer: 11.", "11", 1.0),
        ("0 - 4 = -4\nAnswer: -4", "-4", 1.0),
        ("4 + 7", "11", 0.0),  # the question echoed: math-verify would evaluate it to 11
        ("Answer: 12", "11", 0.0),
        ("The answer is 11.", "11", 0.0),  # no number as the final answer
        ("", "11", 0.0),
    ],
)
def test_final_number_score_wants_a_written_number(response, truth, expected):
    from asyncrl.rewards.scorers import final_number_score

    assert final_number_score("chain_sum", response, truth, {}) == expected
    if response == "4 + 7":
        assert math_verify_score("chain_sum", response, truth, {}) == 1.0  # why math-verify is the wrong reward here
