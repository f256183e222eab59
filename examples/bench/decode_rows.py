"""A decode step's seconds against its rows, at 1 and 2 threads: the built-in engine on a model directory (the ``tail``
bench workload's SFT model by default), eos held down, 48 tokens from one prompt, the median of five paired
rounds after a warm-up (BENCHMARKS.md, "Planner accuracy").

From the repo root: ``HF_HUB_OFFLINE=1 .venv/bin/python examples/bench/decode_rows.py [MODEL_DIR]``
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from asyncrl.models.loading import load_model
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Prompt

STEPS, ROWS = 48, (1, 4, 16, 32)

if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else "runs/bench_work/tail/sft"
    model, tok = load_model(path, "float32", for_training=False)
    eos = torch.tensor([tok.eos_token_id])
    model.lm_head.register_forward_hook(lambda m, i, o: o.index_add_(-1, eos, torch.full_like(o[..., :1], -1e4)))
    engine = RolloutEngine(model, tok)
    prompt = [
        Prompt(
            index=0, prompt_ids=tok.encode("3 + 4 + 5 + 6 + 7 + 8 + 9 + 1 + 2 + 3 ="), data_source="t", ground_truth=""
        )
    ]
    per_step: dict[tuple[int, int], list[float]] = {}
    for r in range(6):  # round 0 warms up
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for rows in ROWS:
                t0 = time.perf_counter()
                engine.generate(prompt, SamplingParams(n=rows, temperature=1.0, max_new_tokens=STEPS), seed=r)
                if r:
                    per_step.setdefault((threads, rows), []).append((time.perf_counter() - t0) / STEPS)
    for (threads, rows), t in sorted(per_step.items()):
        print(f"{threads} thread(s), {rows:2d} rows: {1e3 * statistics.median(t):.2f} ms a step")
