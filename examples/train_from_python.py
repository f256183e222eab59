"""GRPO on the demo task from Python: the config as a dict, the rows as a list, the reward as a lambda.

make demo && python examples/train_from_python.py [key=value ...]     # from make demo's SFT model
"""

import sys

import asyncrl

rows = asyncrl.load_rows("data/chain_sum/train.parquet")  # any list of dicts in verl's schema will do
config = asyncrl.load_config(
    {"model": {"path": "runs/demo/sft"}, "trainer": {"total_training_steps": 20, "default_local_dir": "runs/py"}},
    overrides=sys.argv[1:],
)


def reward(data_source, solution_str, ground_truth, extra_info=None):  # verl's compute_score signature
    return float(solution_str.rsplit("####", 1)[-1].strip() == ground_truth)


result = asyncrl.train(config, reward=reward, train_data=list(rows[:2000]), val_data=list(rows[-64:]))
print(f"model: {result.model_dir}  steps: {result.metrics['step']}  reward/mean: {result.metrics['reward/mean']:.3f}")
