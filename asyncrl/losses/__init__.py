"""Pure PyTorch functions for RL post-training and on-policy distillation: advantages, losses, KL, corrections.

Nothing here knows about models, workers or configs; every function takes tensors and returns tensors (plus stats).
Token-level tensors are ``[B, T]`` over response tokens with ``mask_BT`` (1 = real token); log-probs are natural-log.
"""

from asyncrl.losses.advantages import (
    broadcast_advantages,
    compute_gae,
    compute_grpo_advantages,
    group_reward_spread,
    whiten,
)
from asyncrl.losses.correction import IS_LEVELS, truncated_importance_weights
from asyncrl.losses.distill_loss import (
    REVERSE_KL_ESTIMATORS,
    REVERSE_KL_GRADIENTS,
    TAIL_MODES,
    generalized_jsd_topk,
    mix_on_policy,
    reverse_kl_sampled,
    topk_forward_kl,
)
from asyncrl.losses.kl import KL_KINDS, kl_penalty
from asyncrl.losses.policy_loss import policy_loss_ppo_clip
from asyncrl.losses.tokens import (
    LOSS_AGG_MODES,
    agg_loss,
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    zero_padding,
)
from asyncrl.losses.value import explained_variance, value_loss_clipped

__all__ = [
    "IS_LEVELS",
    "KL_KINDS",
    "LOSS_AGG_MODES",
    "REVERSE_KL_ESTIMATORS",
    "REVERSE_KL_GRADIENTS",
    "TAIL_MODES",
    "agg_loss",
    "broadcast_advantages",
    "compute_gae",
    "compute_grpo_advantages",
    "entropy_from_logits",
    "explained_variance",
    "generalized_jsd_topk",
    "group_reward_spread",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "mix_on_policy",
    "policy_loss_ppo_clip",
    "reverse_kl_sampled",
    "topk_forward_kl",
    "truncated_importance_weights",
    "value_loss_clipped",
    "whiten",
    "zero_padding",
]
