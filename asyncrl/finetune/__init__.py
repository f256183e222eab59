"""Fine-tuning from labels, no rollouts: supervised fine-tuning (``sft``: the warm start of an RL run, ``asyncrl sft``)
and a reward model from correct against corrupted answers (``reward_model``: ``asyncrl train-rm``). A room of its own,
beside the schedules: neither is a schedule, and neither uses the roles, the weight sync or the rollout engines."""
