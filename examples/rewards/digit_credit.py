"""An example user reward for ``reward.custom_function``: partial credit per digit on arithmetic answers.

    asyncrl train --config configs/fully_async.yaml model.path=runs/demo/sft \
        reward.custom_function=examples/rewards/digit_credit.py:digit_credit

verl's signature ``fn(data_source, solution_str, ground_truth, extra_info)``. The exact answer scores 1.0, so held-out
accuracy (the share of answers scored 1.0) still counts only exact answers; a wrong answer earns 0.5 x the share of
its characters that match the ground truth, both right-aligned (units under units), so ``57`` for ``58`` earns 0.25
and ``75`` earns 0.0. BENCHMARKS.md ("Three more levers") measures it against the task's binary scorer on the demo.
"""


def digit_credit(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    answer, truth = solution_str.strip(), str(ground_truth).strip()
    if answer == truth:
        return 1.0
    if not answer or len(answer) > len(truth) + 2:  # empty, or far too long to be a near miss
        return 0.0
    width = max(len(answer), len(truth))
    matches = sum(a == t for a, t in zip(answer.rjust(width), truth.rjust(width)))
    return 0.5 * matches / width
