"""Decode throughput of the RolloutEngine on a randomly initialised preset model (no files, no downloads).

    python -m asyncrl_lab.bench_engine --preset tiny --batch 128 --new-tokens 32 --threads 1 2

Throughput counts generated response tokens per wall-clock second, prefill included. The model is random, so eos is
never forced: every row runs to ``--new-tokens`` unless the random model happens to emit eos.
"""

from __future__ import annotations

import argparse
import random
import string
import time

import torch

from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Prompt


def run(preset: str, batch: int, new_tokens: int, prompt_len: int, threads: int, repeats: int) -> float:
    """Best-of-``repeats`` throughput in generated tokens per second with ``threads`` torch threads."""
    torch.set_num_threads(threads)
    alphabet = string.ascii_letters + string.digits + " +-*/=?.,"
    tokenizer = build_char_tokenizer([string.printable[:95]])
    model = build_model(preset, tokenizer, seed=0)
    rng = random.Random(0)
    prompts = [
        Prompt(i, tokenizer.encode("".join(rng.choices(alphabet, k=rng.randint(prompt_len // 2, prompt_len)))), "b", "")
        for i in range(batch)
    ]
    engine = RolloutEngine(model, tokenizer, eos_token_ids=[tokenizer.eos_token_id], max_batch_size=batch)
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    engine.generate(prompts[: min(8, batch)], SamplingParams(max_new_tokens=4), seed=0)  # warm-up
    best = 0.0
    for r in range(repeats):
        start = time.perf_counter()
        samples = engine.generate(prompts, params, seed=r)
        elapsed = time.perf_counter() - start
        best = max(best, sum(len(s.response_ids) for s in samples) / elapsed)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=64, help="max prompt length in tokens (min is half)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for threads in args.threads:
        tps = run(args.preset, args.batch, args.new_tokens, args.prompt_len, threads, args.repeats)
        setting = f"preset={args.preset} batch={args.batch} new_tokens={args.new_tokens} threads={threads}"
        print(f"{setting}: {tps:.0f} tok/s")


if __name__ == "__main__":
    main()
