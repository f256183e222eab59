"""Per-token KL estimators between the policy and a reference policy (Schulman's k1/k2/k3), as verl's ``kl_penalty``;
their formulas and properties: docs/algorithms/grpo.md, "What it optimises". Values are in nats per token;
gradients flow to ``logp_BT``, ``ref_logp_BT`` is treated as data.
"""

from __future__ import annotations

import torch
from torch import Tensor

from asyncrl.losses.tokens import check_one_of

KL_KINDS: tuple[str, ...] = ("k1", "kl", "k2", "mse", "k3", "low_var_kl")

_ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}
# verl's low_var_kl clamps the log-ratio to +-20 before exp and the result to [-10, 10] (k3 >= 0, so in effect <= 10):
# a bounded penalty keeps one very off-reference token from dominating the loss.
_K3_LOG_RATIO_CLAMP = 20.0
_K3_VALUE_CLAMP = 10.0


def kl_penalty(logp_BT: Tensor, ref_logp_BT: Tensor, kind: str = "low_var_kl") -> Tensor:
    """Per-token KL(pi || pi_ref) estimate ``[B, T]`` of kind k1 (alias ``kl``), k2 (``mse``) or k3 (``low_var_kl``).

    k3 departs from the textbook formula in the same way verl does: the log-ratio is clamped to [-20, 20] and the
    result to [-10, 10], which caps the penalty (and zeroes its gradient) on extreme tokens. It is evaluated as
    expm1(x) - x rather than exp(x) - x - 1, so it does not round to a small negative number when x is tiny.
    No masking is done here; aggregate with :func:`asyncrl.losses.agg_loss`. Inputs must be finite on padding too
    (e.g. pass them through :func:`asyncrl.losses.zero_padding`): a NaN there is masked out of the value by
    ``agg_loss`` but would still reach the gradient through k2/k3.
    """
    check_one_of("kind", kind, KL_KINDS)
    canonical = _ALIASES.get(kind, kind)
    ref_logp_BT = ref_logp_BT.detach()
    if canonical == "k1":
        return logp_BT - ref_logp_BT
    if canonical == "k2":
        return 0.5 * (logp_BT - ref_logp_BT) ** 2
    log_r = torch.clamp(ref_logp_BT - logp_BT, -_K3_LOG_RATIO_CLAMP, _K3_LOG_RATIO_CLAMP)
    k3 = torch.expm1(log_r) - log_r  # = e^x - 1 - x; expm1 keeps it >= 0 in float32 when x is tiny
    return torch.clamp(k3, -_K3_VALUE_CLAMP, _K3_VALUE_CLAMP)
