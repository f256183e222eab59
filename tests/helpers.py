"""Builders shared by integration tests: a tiny chain_sum dataset and a micro model made here, in seconds."""

from __future__ import annotations

from pathlib import Path

from asyncrl.data.tasks import write_task_dataset
from asyncrl.finetune.sft import init_model_from_data

# One size for every test's local Ray cluster: the session shares one cluster (tests/conftest.py), and init_ray
# restarts it (~5 s) when a run asks for another size. 3 fits the largest test (2 trainer ranks + a rollout worker).
RAY_CPUS = 3

TASK_KWARGS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def make_data(root: Path, size: int = 64, test_size: int = 16) -> tuple[Path, Path]:
    return write_task_dataset(
        "chain_sum", size, 0, root / "data", test_size=test_size, prompt_template="{expression} =", **TASK_KWARGS
    )


def length_reward(root: Path) -> str:
    """``reward.custom_function=...`` of a reward that grows with the response's length (1/1000 per character):
    the samples of a group differ in reward whatever the model samples, so every GRPO step has a gradient."""
    path = root / "length_reward.py"
    path.write_text(
        "def length_reward(data_source, solution_str, ground_truth, extra_info):\n    return len(solution_str) / 1000\n"
    )
    return f"reward.custom_function={path}:length_reward"


def make_model(root: Path, train_file: Path, preset: str = "micro", seed: int = 0) -> Path:
    out = root / f"model_{preset}"
    init_model_from_data(preset, [str(train_file)], str(out), seed)
    return out


def train_overrides(model: Path, train: Path, test: Path, run_dir: Path, steps: int) -> list[str]:
    return [
        f"model.path={model}",
        f"data.train_files=[{train}]",
        f"data.val_files=[{test}]",
        "data.train_batch_size=4",
        "actor.ppo_mini_batch_size=2",
        "actor.ppo_micro_batch_size=4",
        "rollout.n=4",
        "rollout.response_length=6",
        "actor.optim.lr=1e-3",
        f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[jsonl,tensorboard]",
        "trainer.save_freq=2",
        "trainer.test_freq=2",
        "trainer.cpus_per_worker=1",
        f"ray.num_cpus={RAY_CPUS}",
    ]


def sharpen_attention(model_dir: Path, out: Path | None = None, factor: float = 8.0) -> Path:
    """``model_dir`` with q and k weights x ``factor`` (saved to ``out``, default in place). A freshly initialised
    model attends almost uniformly, so positions (and RoPE) barely change its outputs; a sharpened one shows them."""
    import torch

    from asyncrl.models.loading import load_model

    model, tok = load_model(model_dir)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(factor)
    out = out or model_dir
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def policy_gap(a: Path, b: Path, seed: int = 0) -> float:
    """The largest |log p_a - log p_b| of two model directories, over the vocabulary at every position of a fixed
    random batch of token ids (teacher-forced): how far apart the two policies are as functions, which is what two
    ways of training the same steps must agree on (their raw weights can differ more, in directions the outputs
    barely feel, where Adam scales float round-off of near-zero gradients up to lr-sized steps)."""
    import torch

    from asyncrl.models.loading import load_model

    ma, _ = load_model(a, for_training=False)
    mb, _ = load_model(b, for_training=False)
    ids = torch.randint(0, ma.config.vocab_size, (4, 16), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        la = torch.log_softmax(ma(input_ids=ids).logits.float(), -1)
        lb = torch.log_softmax(mb(input_ids=ids).logits.float(), -1)
    return float((la - lb).abs().max())


def ppo_update(model, optimizer, scheduler, batch, actor, correction, temperature, num_mini_batches, seed, dp=None):
    """The trainer's update on a batch of advantages (``batch.policy``: a ``PolicyTarget``; ``batch.old_logp_BT``
    and, for a KL loss, ``ref_logp_BT`` filled), with the PPO-clip loss ``actor`` configures."""
    from dataclasses import replace

    from asyncrl.algorithms.grpo import PolicyTarget, PPOClip
    from asyncrl.trainer.update import fit

    target = PolicyTarget(batch.policy.advantages_BT, PPOClip.of(actor, correction, temperature))
    return fit(model, optimizer, scheduler, replace(batch, policy=target), actor, num_mini_batches, seed, dp=dp)


def advantages(advantages_BT):
    """A ``PolicyTarget`` of ``advantages_BT`` with default knobs (``ppo_update`` puts the actor's in)."""
    from asyncrl.algorithms.grpo import PolicyTarget, PPOClip
    from asyncrl.config import ActorConfig, RolloutCorrectionConfig

    return PolicyTarget(advantages_BT, PPOClip.of(ActorConfig(), RolloutCorrectionConfig()))
