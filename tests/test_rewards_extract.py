"""extract_answer: the conventions models use to state a final answer."""

import pytest

from asyncrl.rewards.scorers import extract_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", "42"),
        ("  42 \n", "42"),
        ("Let me think.\n<answer> 7 </answer>", "7"),
        ("<answer>1</answer> wait, no: <answer>2</answer>\nbye", "2"),
        ("<ANSWER>x + 1</ANSWER>", "x + 1"),
        ("3 + 4 = 7\n#### 7", "7"),
        ("so\nAnswer: -12\nHope this helps!", "-12"),
        ("Final answer:\n\n  5", "5"),
        ("**Answer:** 42", "42"),
        ("**42**", "42"),
        ("#### 3\nAnswer: 4", "4"),  # the later marker wins
        ("step one\nstep two\n\n9\n\n", "9"),
        ("<answer>12", "<answer>12"),  # unclosed (truncated) tag is not an answer: last line
        ("Answer:", ""),
        ("", ""),
        ("\n  \n", ""),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected
