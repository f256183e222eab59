"""FSDP2 in bf16 as verl trains: fp32 shards are the master weights (AdamW steps them, no ``MasterWeightsAdamW``),
a ``MixedPrecisionPolicy`` computes in bf16 and reduces in fp32; the reference model is sharded too, its shards (and
the actor's, with the optimizer state) offloaded to the host between passes.

Two sharded Ray ranks against two DDP ranks (bf16 weights + fp32 masters) on the same run: one_step_off, so the
rollout pool makes the samples and both trainers see the same ones. Both recompute their layers' activations
(``actor.gradient_checkpointing``: non-reentrant, under FSDP2 too).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncrl.config import ConfigError
from asyncrl.schedules import run_training
from tests.helpers import policy_gap
from tests.test_fsdp import RAY2, _cfg, _ckpt, _steps, setup  # noqa: F401 - setup is a fixture

BF16 = (
    "model.dtype=bfloat16",
    "actor.use_kl_loss=true",
    "ref.fsdp_config.param_offload=true",
    "actor.optim.lr=1e-3",
    "actor.gradient_checkpointing=true",
)


def _state(run_dir: Path, step: int) -> dict:
    return torch.load(run_dir / "checkpoints" / f"step_{step}" / "trainer_state.pt", weights_only=False)


@pytest.mark.ray
def test_bf16_sharded_ranks_with_fp32_shards_train_as_ddp_with_masters(setup, tmp_path):  # noqa: F811
    sharded, ddp = tmp_path / "fsdp2", tmp_path / "ddp"
    offload = ("actor.fsdp_config.param_offload=true", "actor.fsdp_config.optimizer_offload=true")
    run_training(_cfg(setup, sharded, 2, *RAY2, *BF16, *offload))
    run_training(_cfg(setup, ddp, 2, "trainer.backend=in_process", "trainer.num_workers=2", *BF16))
    assert [m["reward/mean"] for m in _steps(sharded)] == [m["reward/mean"] for m in _steps(ddp)]
    gap, moved = policy_gap(_ckpt(sharded, 2), _ckpt(ddp, 2)), policy_gap(_ckpt(sharded, 2), setup[1])
    # bf16 resolves 2^-8: the fp32 test's 1e-3 is below what two bf16 trainers can agree on. DDP accumulates its
    # micro-batches' gradients in bf16, FSDP2 reduces them in fp32. Measured (2026-11-27, BENCHMARKS.md): this gap is
    # 3.1e-3 of a 0.38 move with this CPU's AVX-512 kernels and 1.0e-2 with AVX2's; training in bf16 instead of fp32
    # moves the policy by 0.087, and DDP in bf16 on 1 rank against 2 ranks by 0.157. So the bound is a share of the
    # move well under bf16's own effect (about move / 4.5), with room for any CPU's kernels
    assert gap < moved / 10, (gap, moved)  # the same policy as DDP's, within bf16's reproducibility; it did train
    state = _state(sharded, 2)
    assert "optimizer" not in state and "master_weights" in _state(ddp, 2)["optimizer"]  # FSDP2's: in its shards

    # resumed: the fp32 shards come back from the sharded checkpoint, not from the bf16 HF weights
    run_training(_cfg(setup, sharded, 3, *RAY2, *BF16))
    run_training(_cfg(setup, ddp, 3, "trainer.backend=in_process", "trainer.num_workers=2", *BF16))
    assert [m["step"] for m in _steps(sharded)] == [m["step"] for m in _steps(ddp)] == [1, 2, 3]
    gap3, moved3 = policy_gap(_ckpt(sharded, 3), _ckpt(ddp, 3)), policy_gap(_ckpt(ddp, 2), _ckpt(ddp, 3))
    assert gap3 < moved3, (gap3, moved3)


def test_offload_keys_are_refused_where_they_cannot_act(setup, tmp_path):  # noqa: F811
    with pytest.raises(ConfigError, match="actor.fsdp_config.param_offload.*fsdp2"):
        _cfg(setup, tmp_path, 1, "actor.fsdp_config.param_offload=true", "actor.fsdp_config.optimizer_offload=true")
    with pytest.raises(ConfigError, match="actor.fsdp_config.optimizer_offload.*CPUOffloadPolicy"):
        _cfg(setup, tmp_path, 1, *RAY2, "actor.fsdp_config.optimizer_offload=true")
