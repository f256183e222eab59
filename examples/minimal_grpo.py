"""GRPO in one file, in one process: the package's own engine, rewards and losses, and nothing else.

    make demo && python examples/minimal_grpo.py     # GRPO from make demo's SFT start (runs/demo/sft)
    python examples/minimal_grpo.py --sft-steps 900   # or first warm-start runs/tiny_init (make setup) here

Per step: --prompts prompts of the default task (chain_sum) -> N responses each from the rollout engine -> the task's
reward -> group-normalised advantages -> the PPO-clip loss over MINI_BATCHES optimizer steps -> the new weights copied
into the engine, which holds its own copy of the model as a rollout worker does. `asyncrl train` runs the same recipe
(configs/quickstart.yaml) with workers, schedules and a config. Departures from the textbook, as quickstart: the PPO
ratio's old policy is the engine's own log-probs (on-policy: the ratio is about 1 on the first mini-batch, the clip
acts from the second on); no KL penalty, no reference model. A group whose rewards are all equal is left out: it adds
no gradient (the trainer skips its rows too, but counts their tokens in the token-mean, so its steps are smaller).
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from asyncrl import (
    PromptDataset,
    RewardFn,
    RolloutEngine,
    Sample,
    SamplingParams,
    collate,
    evaluate_prompts,
    forward_logits,
    group_ids,
    load_model,
    load_sft_config,
    losses,
    rewards_of,
    run_sft,
)

N, TEMPERATURE, RESPONSE_LENGTH = 8, 1.0, 16  # responses per prompt (a group), sampling, response tokens at most
LR, MINI_BATCHES, CLIP = 1e-4, 2, 0.2  # Adam's lr, optimizer steps per batch, PPO's ratio clip (both sides)


def warm_start(init: str, data: str, steps: int, out: str, threads: int) -> str:
    """`asyncrl sft` for ``steps`` steps: an untrained model never answers right, so GRPO would have no reward spread
    to learn from (after 300 steps, 12% held out, it barely moved). Returns the SFT model's directory."""
    data_ = [f"data.train_files=[{data}/train.parquet]", "data.val_files=[]"]
    trainer = [f"trainer.total_steps={steps}", f"trainer.output_dir={out}", f"trainer.num_threads={threads}"]
    run_sft(load_sft_config("configs/sft_tiny.yaml", [f"model.path={init}", *data_, *trainer]))
    return out


def accuracy(engine: RolloutEngine, prompts: list) -> float:
    """Greedy held-out accuracy: the share of answers the task's own scorer gives 1.0 (whatever reward trains)."""
    generate = lambda ps, params, seed: engine.generate(ps, params, seed=seed)  # noqa: E731
    return evaluate_prompts(generate, prompts, RewardFn(), RESPONSE_LENGTH)["accuracy"]


def grpo_step(model: torch.nn.Module, opt: torch.optim.Optimizer, samples: list[Sample], pad_id: int) -> float:
    """One GRPO update on scored samples (a prompt's responses form a group); returns its mini-batches' mean loss."""
    adv_B = losses.compute_grpo_advantages(rewards_of(samples), group_ids(samples))  # (r - group mean) / group std
    kept = [i for i, a in enumerate(adv_B.tolist()) if a != 0.0]  # a group of equal rewards adds no gradient
    if not kept:
        return 0.0
    batch = collate([samples[i] for i in kept], pad_id)
    adv_BT = losses.broadcast_advantages(adv_B[kept], batch.response_mask_BT)  # each token: its response's advantage
    total, chunks = 0.0, torch.randperm(batch.size).chunk(MINI_BATCHES)
    for idx_M in chunks:
        mb = batch.select(idx_M)
        logp_MT = losses.logprobs_from_logits(forward_logits(model, mb, TEMPERATURE), mb.response_ids_BT)
        loss, _ = losses.policy_loss_ppo_clip(logp_MT, mb.behav_logp_BT, adv_BT[idx_M], mb.response_mask_BT, CLIP, CLIP)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        total += loss.item() / len(chunks)
    return total


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="runs/demo/sft", help="the model to start from (default: make demo's SFT)")
    ap.add_argument("--sft-steps", type=int, default=0, help="> 0: start from this many SFT steps on runs/tiny_init")
    ap.add_argument("--steps", type=int, default=60, help="GRPO steps")
    ap.add_argument("--prompts", type=int, default=32, help="prompts per step")
    ap.add_argument("--data", default="data/chain_sum", help="a folder with train.parquet and test.parquet")
    ap.add_argument("--held-out", type=int, default=500, help="test.parquet items the accuracy is measured on")
    ap.add_argument("--reward", help="a custom reward function, path.py:name (default: the task's own scorer)")
    ap.add_argument("--out", default="runs/minimal_grpo")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: fastest on a busy 2-core machine)")
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    if not args.sft_steps and not Path(args.model).is_dir():
        ap.error(f"--model {args.model}: no such directory (make demo writes runs/demo/sft; or pass --sft-steps 900)")
    path = args.model
    if args.sft_steps:
        path = warm_start("runs/tiny_init", args.data, args.sft_steps, f"{args.out}/sft", args.threads)

    model, tok = load_model(path)  # the policy we train
    engine = RolloutEngine(load_model(path, for_training=False)[0], tok)  # the engine's own copy of it
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    reward_fn = RewardFn(args.reward)
    train = PromptDataset.from_files(f"{args.data}/train.parquet", tok, max_prompt_length=128)
    test = PromptDataset.from_files(f"{args.data}/test.parquet", tok, max_prompt_length=128)
    held_out = [test[i] for i in range(min(args.held_out, len(test)))]
    before = accuracy(engine, held_out)
    print(f"held-out accuracy before: {before:.1%} ({len(held_out)} items, greedy)")

    rng, t0, step_losses = random.Random(args.seed), time.time(), []
    params = SamplingParams(n=N, temperature=TEMPERATURE, max_new_tokens=RESPONSE_LENGTH)
    for step in range(args.steps):
        prompts = [train.get(i, epoch=step) for i in rng.sample(range(len(train)), args.prompts)]
        samples = engine.generate(prompts, params, seed=args.seed * 1_000_003 + step)
        reward_fn.score(samples)  # fills sample.reward
        step_losses.append(grpo_step(model, opt, samples, tok.pad_token_id))
        engine.update_weights({n: p.detach() for n, p in model.named_parameters()}, version=step + 1)
        mean_reward = sum(s.reward for s in samples) / len(samples)
        print(f"step {step + 1}: reward {mean_reward:.3f} loss {step_losses[-1]:+.4f} ({time.time() - t0:.0f} s)")

    after = accuracy(engine, held_out)
    print(f"held-out accuracy after {args.steps} steps: {after:.1%} (before {before:.1%}), {time.time() - t0:.0f} s")
    model.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    return {"accuracy_before": before, "accuracy_after": after, "losses": step_losses, "model_dir": args.out}


if __name__ == "__main__":
    main()
