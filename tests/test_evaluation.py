"""Held-out accuracy, overall and by group (how the demo shows where a gain comes from).

The generate function here is a plain function that answers from a table: the thing under test is the counting, and
the scoring goes through the real reward registry (reasoning-gym's chain_sum scorer).
"""

from asyncrl.rewards.reward_fn import build_reward_fn
from asyncrl.run.evaluation import evaluate_prompts
from asyncrl.types import Prompt, Sample


def _prompt(i: int, truth: str, level: str) -> Prompt:
    return Prompt(index=i, prompt_ids=[1, 2], data_source="chain_sum", ground_truth=truth, extra_info={"level": level})


def test_accuracy_and_by_group_count_correct_answers_per_group():
    # (ground truth, what the "model" answers, group): easy 2 of 3 right, hard 1 of 2 right.
    table = [("3", "3", "easy"), ("7", "7", "easy"), ("5", "4", "easy"), ("-12", "-12", "hard"), ("40", "41", "hard")]
    prompts = [_prompt(i, truth, level) for i, (truth, _, level) in enumerate(table)]

    def generate(ps, params, seed):
        assert params.temperature == 0.0 and params.n == 1
        return [
            Sample(prompt=p, response_ids=[9], logprobs=[0.0], versions=[0], response_text=table[p.index][1])
            for p in ps
        ]

    res = evaluate_prompts(
        generate, prompts, build_reward_fn(None), 8, batch_size=2, group_of=lambda p: p.extra_info["level"]
    )
    assert res["accuracy"] == 3 / 5 and res["n"] == 5.0
    assert res["by_group"] == {"easy": [2 / 3, 3], "hard": [1 / 2, 2]}
    assert "by_group" not in evaluate_prompts(generate, prompts, build_reward_fn(None), 8)
