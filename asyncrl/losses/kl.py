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
# verl's low_var_kl clamps, which bound the penalty of one very off-reference token (k3 >= 0: in effect <= 10)
_K3_LOG_RATIO_CLAMP = 20.0
_K3_VALUE_CLAMP = 10.0


def kl_penalty(logp_BT: Tensor, ref_logp_BT: Tensor, kind: str = "low_var_kl") -> Tensor:
    """Per-token KL(pi || pi_ref) estimate ``[B, T]`` of kind k1 (alias ``kl``), k2 (``mse``) or k3 (``low_var_kl``,
    clamped as verl's). No masking is done here; aggregate with ``agg_loss``. Inputs must be finite on padding too
    (``zero_padding``): a NaN there is masked out of the value by ``agg_loss`` but still reaches the gradient.
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
