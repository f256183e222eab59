"""Activation checkpointing (``actor.gradient_checkpointing``): each decoder layer recomputed in the backward gives the
gradients the stored activations give; null means on where the trainer computes on a GPU, off on the CPU."""

from __future__ import annotations

import copy

import torch

from asyncrl import losses
from asyncrl.config import ActorConfig
from asyncrl.data.collate import micro_batches
from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.trainer.forward import batching, enable_checkpointing, forward_logits, use_checkpointing
from tests.test_policy_update import CHARS, _batch


def _grads_and_layer_calls(model: torch.nn.Module, batch) -> tuple[dict[str, torch.Tensor], int]:
    """Gradients of a policy-gradient loss over ``batch``'s packed micro-batches, and how often decoder layer 0's MLP
    ran (counted in its ``forward``: torch's recompute runs no module hooks)."""
    calls = [0]
    mlp = model.model.layers[0].mlp
    forward = mlp.forward

    def counted(*args, **kwargs):
        calls[0] += 1
        return forward(*args, **kwargs)

    mlp.forward = counted
    model.train()
    for _, mb in micro_batches(batch, batching(ActorConfig(ppo_micro_batch_size=3))):
        logp = losses.logprobs_from_logits(forward_logits(model, mb, 1.0), mb.response_ids_BT)
        (-(logp * mb.policy.advantages_BT * mb.response_mask_BT).sum()).backward()
    del mlp.forward
    return {n: p.grad.clone() for n, p in model.named_parameters()}, calls[0]


def test_recomputed_layers_give_the_stored_activations_gradients():
    tok = build_char_tokenizer([CHARS])
    plain = build_model("micro", tok, seed=0)  # fp32
    checkpointed = copy.deepcopy(plain)
    enable_checkpointing(checkpointed)
    batch = _batch(tok, [1.0, -1.0, 0.5, -0.5, 1.5, -0.5, 0.7, -0.7])
    want, plain_calls = _grads_and_layer_calls(plain, batch)
    got, recomputed_calls = _grads_and_layer_calls(checkpointed, batch)
    assert recomputed_calls == 2 * plain_calls > 0  # every micro-batch's layer ran again in its backward
    assert want.keys() == got.keys()
    for name, g in want.items():
        assert float(g.abs().max()) > 0 or name.endswith("bias"), name  # the loss reaches every weight
        assert torch.allclose(got[name], g, rtol=1e-5, atol=1e-7), name


def test_null_means_on_for_a_gpu_and_off_for_the_cpu():
    assert use_checkpointing(None, torch.device("cuda", 0)) and not use_checkpointing(None, torch.device("cpu"))
    assert use_checkpointing(True, torch.device("cpu")) and not use_checkpointing(False, torch.device("cuda", 0))
