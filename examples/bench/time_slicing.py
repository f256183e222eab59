"""Two roles time-sliced on this machine's cores: a one-thread decode beside a training loop of 1 or 2 threads, each in
its own process for 12 s, against each alone (tiny preset, random weights; two rounds). The planner's clock prices a
computation among others at its fair share, cores / threads running (BENCHMARKS.md, "Speed against sync", "Time-slicing
on these two cores").

From the repo root: ``HF_HUB_OFFLINE=1 .venv/bin/python examples/bench/time_slicing.py [TRAIN_THREADS]``
"""

from __future__ import annotations

import multiprocessing as mp
import string
import sys
import time

import torch

SECONDS = 12


def _tok_model():
    from asyncrl.models.presets import build_model
    from asyncrl.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer([string.printable[:95]])
    return tok, build_model("tiny", tok, seed=0)


def decode(q) -> None:
    """Tokens/s of a one-thread decode: 2 prompts x 8 rows of 64 tokens, eos held down, call after call."""
    from asyncrl.rollout.engine import RolloutEngine
    from asyncrl.rollout.sampling import SamplingParams
    from asyncrl.types import Prompt

    torch.set_num_threads(1)
    tok, model = _tok_model()
    eos = torch.tensor([tok.eos_token_id])
    model.lm_head.register_forward_hook(lambda m, i, o: o.index_add_(-1, eos, torch.full_like(o[..., :1], -1e4)))
    engine = RolloutEngine(model, tok)
    prompts = [Prompt(index=i, prompt_ids=tok.encode(f"{i} + {i} ="), data_source="t", ground_truth="") for i in (0, 1)]
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=64)
    engine.generate(prompts, params, seed=0)
    t0, tokens = time.perf_counter(), 0
    while time.perf_counter() - t0 < SECONDS:
        tokens += sum(len(s.response_ids) for s in engine.generate(prompts, params, seed=1))
    q.put(("decode tokens/s", tokens / (time.perf_counter() - t0)))


def train(q, threads: int) -> None:
    """Steps/s of a training loop on ``threads`` threads: forward, backward and AdamW over 16 rows x 160 tokens."""
    torch.set_num_threads(threads)
    _, model = _tok_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids = torch.randint(0, 90, (16, 160))

    def step() -> None:
        logits = model(input_ids=ids).logits
        torch.log_softmax(logits.float(), -1).mean().backward()
        opt.step()
        opt.zero_grad()

    step()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < SECONDS:
        step()
        n += 1
    q.put((f"train steps/s ({threads} threads)", n / (time.perf_counter() - t0)))


if __name__ == "__main__":
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    ctx = mp.get_context("spawn")
    for rnd in range(2):
        for case in (["decode"], ["train"], ["decode", "train"]):
            q = ctx.Queue()
            procs = [
                ctx.Process(target=decode, args=(q,)) if c == "decode" else ctx.Process(target=train, args=(q, threads))
                for c in case
            ]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
            got = dict(q.get() for _ in procs)
            print(rnd, " + ".join(case), {k: round(v, 2) for k, v in got.items()}, flush=True)
