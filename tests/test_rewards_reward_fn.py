"""RewardFn: batch scoring in place, failures confined to their sample, custom functions loaded from a spec."""

import math
import pickle
import textwrap
from pathlib import Path

import pytest

from asyncrl.rewards.custom import RewardSpecError, load_custom_function
from asyncrl.rewards.reward_fn import RewardFn, build_reward_fn, normalize_result
from asyncrl.types import Prompt, Sample

CUSTOM = """
def compute_score(data_source, solution_str, ground_truth, extra_info):
    return {"score": float(solution_str.strip() == ground_truth), "acc": True, "pred": solution_str, "len": 3}


def shouty(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "boom":
        raise RuntimeError("scorer exploded")
    return 2.0 if solution_str.isupper() else 0.0


def not_a_number(data_source, solution_str, ground_truth, extra_info):
    return "high"


NOT_CALLABLE = 3
"""


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(textwrap.dedent(CUSTOM))
    return path


def _sample(text, truth="4", source="chain_sum", index=0, extra_info=None):
    prompt = Prompt(index=index, prompt_ids=[1, 2], data_source=source, ground_truth=truth, extra_info=extra_info or {})
    return Sample(prompt=prompt, response_ids=[3], logprobs=[-0.1], versions=[0], response_text=text)


def test_registry_scores_samples_in_place():
    samples = [_sample("<answer>4</answer>"), _sample("5", index=1), _sample("\\frac{1}{2}", "0.5", "math", 2)]

    stats = build_reward_fn().score(samples)

    assert [s.reward for s in samples] == [1.0, 0.0, 1.0]
    assert not any(s.reward_failed for s in samples)
    assert stats == {"reward/failed_count": 0}


def test_unknown_data_source_fails_only_that_sample_and_is_counted():
    fn = build_reward_fn()
    samples = [_sample("4"), _sample("4", source="mystery", index=7)]
    samples[1].reward = 5.0

    stats = fn(samples)

    assert (samples[0].reward, samples[0].reward_failed) == (1.0, False)
    assert (samples[1].reward, samples[1].reward_failed, samples[1].reward_extra) == (0.0, True, {})
    assert stats == {"reward/failed_count": 1} and fn.failed_total == 1
    assert fn.last_errors[0].startswith("sample 0:7 (data_source 'mystery'): UnknownDataSourceError: no reward scorer")
    assert "chain_sum" in fn.last_errors[0]


def test_custom_function_is_used_for_every_source_and_dict_extras_kept(reward_file):
    fn = build_reward_fn(f"{reward_file}")  # no ':name' means verl's default compute_score
    samples = [_sample("4", source="anything"), _sample("5")]

    fn.score(samples)

    assert [s.reward for s in samples] == [1.0, 0.0]
    assert samples[0].reward_extra == {"acc": 1.0, "len": 3.0}  # "pred" is a string: dropped


def test_raising_custom_scorer_marks_failure_and_does_not_raise(reward_file, caplog):
    fn = build_reward_fn(f"{reward_file}:shouty")
    samples = [_sample("YES"), _sample("boom", index=1), _sample("no", index=2)]

    stats = fn.score(samples)

    assert [(s.reward, s.reward_failed) for s in samples] == [(2.0, False), (0.0, True), (0.0, False)]
    assert stats == {"reward/failed_count": 1}
    assert fn.last_errors == ["sample 0:1 (data_source 'chain_sum'): RuntimeError: scorer exploded"]
    assert "scorer exploded" in caplog.text


def test_bad_return_value_fails_the_sample_with_the_function_named(reward_file):
    fn = build_reward_fn(f"{reward_file}:not_a_number")
    sample = _sample("x")

    fn.score([sample])

    assert sample.reward_failed
    assert "reward function" in fn.last_errors[0] and "returned str, expected a number" in fn.last_errors[0]


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ({"acc": 1.0}, "returned a dict without 'score'"),
        ({"score": "1"}, "returned score of type str"),
        (math.nan, "non-finite reward"),
        (None, "returned NoneType"),
    ],
)
def test_normalize_result_rejects_unusable_values(result, message):
    with pytest.raises(ValueError, match=message):
        normalize_result(result, "scorer f")


def test_normalize_result_accepts_numbers_bools_and_scalars():
    import numpy as np

    assert normalize_result(np.float32(0.5), "f") == (0.5, {})
    assert normalize_result({"score": True, "acc": np.int64(1)}, "f") == (1.0, {"acc": 1.0})


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("{dir}/missing.py:compute_score", "no such file"),
        (
            "{dir}/my_reward.py:nope",
            "has no function 'nope' (callables there: ['compute_score', 'not_a_number', 'shouty'])",
        ),
        ("{dir}/my_reward.py:NOT_CALLABLE", "'NOT_CALLABLE' is a int, not callable"),
        ("no_such_pkg_xyz.mod:fn", "cannot import module 'no_such_pkg_xyz.mod'"),
        ("justaname", "expected 'path/to/file.py:function_name'"),
        ("{dir}/my_reward.py:", "expected 'path/to/file.py:function_name'"),
    ],
)
def test_bad_spec_is_reported_at_build_time_naming_the_spec(reward_file, spec, message):
    spec = spec.format(dir=reward_file.parent)

    with pytest.raises(RewardSpecError) as info:
        build_reward_fn(spec)

    assert str(info.value).startswith(f"custom reward function {spec!r}")
    assert message in str(info.value)


def test_reward_file_that_fails_to_import_names_the_error(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import definitely_not_installed_module\n")

    with pytest.raises(RewardSpecError, match="importing .*broken.py failed: ModuleNotFoundError"):
        load_custom_function(f"{path}:compute_score")


def test_module_spec_loads_an_importable_function():
    assert load_custom_function("asyncrl.rewards.scorers:math_verify_score").__name__ == "math_verify_score"


def test_reward_fn_survives_pickling_with_a_custom_file_function(reward_file):
    fn = pickle.loads(pickle.dumps(RewardFn(f"{reward_file}:shouty")))
    sample = _sample("LOUD")

    fn.score([sample])

    assert sample.reward == 2.0


def test_example_digit_credit_reward_gives_partial_credit_but_full_score_only_when_exact():
    """examples/rewards/digit_credit.py, loaded as a user would (`reward.custom_function=...`); values by hand."""
    spec = f"{Path(__file__).resolve().parents[1] / 'examples' / 'rewards' / 'digit_credit.py'}:digit_credit"
    fn = build_reward_fn(spec)
    texts = ["58", " 58\n", "57", "75", "8", "-58", "", "12345", "1058"]
    samples = [_sample(t, truth="58", index=i) for i, t in enumerate(texts)]

    fn.score(samples)

    # 57: the tens digit matches (1 of 2) -> 0.25; 8: " 8" vs "58" -> 0.25; -58: 2 of 3 -> 1/3;
    # 1058: 2 of 4 characters -> 0.25 (two longer than the truth, still a near miss); 12345: three longer -> 0.
    assert [s.reward for s in samples] == pytest.approx([1.0, 1.0, 0.25, 0.0, 0.25, 1 / 3, 0.0, 0.0, 0.25])
    assert [s.reward == 1.0 for s in samples] == [True, True] + [False] * 7  # accuracy counts exact answers only
    assert not any(s.reward_failed for s in samples)
