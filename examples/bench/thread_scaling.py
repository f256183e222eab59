"""Thread scaling of the demo's two phases, in one process: generation (32 prompts x 8, at most 16 new tokens) and the
update (prefix sharing and packing on, as the new sync runs it), at 1 and 2 torch threads; median of 5 after a warm-up.
The 1-thread costs bound what any overlap of the two can reach on 2 cores (BENCHMARKS.md, "Speed against sync").

Needs the bench workload (``asyncrl bench --workload demo`` prepares it). From the repo root:
``HF_HUB_OFFLINE=1 .venv/bin/python examples/bench/thread_scaling.py``
"""

from __future__ import annotations

import copy
import statistics
import time

import torch

from asyncrl import losses
from asyncrl.algorithms.grpo import PolicyTarget, PPOClip
from asyncrl.config import ActorConfig, RolloutCorrectionConfig
from asyncrl.data.collate import collate, group_ids, rewards_of
from asyncrl.data.dataset import PromptDataset
from asyncrl.data.rows import load_rows
from asyncrl.models.loading import load_model
from asyncrl.rewards.reward_fn import build_reward_fn
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.trainer.update import fit

WORK = "runs/bench_work/short"


def median_seconds(fn, runs: int = 6) -> float:
    times = []
    for i in range(runs):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])  # the first is warm-up


def main() -> None:
    model, tok = load_model(f"{WORK}/sft")
    dataset = PromptDataset(load_rows(f"{WORK}/data/train.parquet")[:32], tok, 128)
    prompts = [dataset[i] for i in range(32)]
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=16)
    engine = RolloutEngine(model, tok)
    samples = engine.generate(prompts, params, seed=0)
    build_reward_fn(None).score(samples)
    batch = collate(samples, tok.pad_token_id)
    adv = losses.compute_grpo_advantages(rewards_of(samples), group_ids(samples), norm_by_std=True)
    actor = ActorConfig(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=4096, ppo_mini_batch_size=32)
    spec = PPOClip.of(actor, RolloutCorrectionConfig())
    batch.policy = PolicyTarget(losses.broadcast_advantages(adv, batch.response_mask_BT), spec)
    batch.old_logp_BT = batch.behav_logp_BT.clone()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        gen = median_seconds(lambda i: engine.generate(prompts, params, seed=i))
        m = copy.deepcopy(model)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-12)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
        upd = median_seconds(lambda _, m=m, opt=opt, sched=sched: fit(m, opt, sched, batch, actor, 1, 0))
        print(f"threads={threads} generate median {gen:.3f} s  update median {upd:.3f} s", flush=True)


if __name__ == "__main__":
    main()
