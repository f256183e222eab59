"""What a weight sync with partial rollout costs the built-in engine afterwards: the rows it interrupted come back with
partial responses of many lengths and are prefilled again in one admission. Timed with the prefixes in one forward
(``MIN_SAVED_POSITIONS`` past any saving) and split by length (``prefill_buckets``, the engine's default), on the same
rows, the two taking turns.

From the repo root, on a model directory and its prompts (a bench workload's warm start):
``HF_HUB_OFFLINE=1 PYTHONPATH=. .venv/bin/python examples/bench/readmit.py runs/bench_work/tail/sft \\
runs/bench_work/tail/data/train.parquet``
"""

from __future__ import annotations

import copy
import statistics
import sys
import time
from dataclasses import replace

import torch

from asyncrl.data.dataset import PromptDataset
from asyncrl.data.rows import load_rows
from asyncrl.models.loading import load_model
from asyncrl.rollout import continuous
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Sample

SLOTS, N, NEW_TOKENS, ROUNDS = 32, 2, 256, 5


def partial_rows(engine: RolloutEngine, prompts: list, params: SamplingParams, steps: int, seed: int) -> list:
    """Stream groups of N into the slots for ``steps`` steps (a new group whenever one fits), then interrupt: the rows a
    sync would hand back."""
    k = 0
    for _ in range(steps):
        while SLOTS - engine.live_rows() >= N:
            p = replace(prompts[k % len(prompts)], epoch=seed * 1000 + k // len(prompts))
            engine.submit([Sample(p, [], [], [], "interrupted", 0, row=j) for j in range(N)], params, seed)
            k += 1
        engine.step()
    return [s for s in engine.interrupt() if s.stop_reason == "interrupted"]


def admit_once(engine: RolloutEngine, rows: list, params: SamplingParams, seed: int, min_saved: int) -> float:
    continuous.MIN_SAVED_POSITIONS = min_saved
    engine.submit(copy.deepcopy(rows), params, seed)
    t0 = time.perf_counter()
    engine.step()
    dt = time.perf_counter() - t0
    engine.interrupt()
    return dt


if __name__ == "__main__":
    torch.set_num_threads(1)  # as the Rollouter of a 2-core run
    model, tok = load_model(sys.argv[1])
    data = PromptDataset(load_rows([sys.argv[2]])[:64], tok, 128)
    prompts = [data[i] for i in range(len(data))]
    params = SamplingParams(n=N, temperature=1.0, max_new_tokens=NEW_TOKENS)
    engine = RolloutEngine(model, tok, max_batch_size=SLOTS)
    default = continuous.MIN_SAVED_POSITIONS
    print("| rows | tokens | padded in one forward | forwards split | one forward s | split s | speed-up |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r, steps in enumerate((30, 60, 120, 240)):
        rows = partial_rows(engine, prompts, params, steps, seed=r)
        lengths = [len(s.prompt.prompt_ids) + len(s.response_ids) for s in rows]
        forwards = len(continuous.prefill_buckets(lengths, default))
        one, split = [], []
        for _ in range(ROUNDS):  # the two take turns on the same rows
            one.append(admit_once(engine, rows, params, r, 10**9))
            split.append(admit_once(engine, rows, params, r, default))
        a, b = statistics.median(one), statistics.median(split)
        padded = len(rows) * max(lengths)
        print(f"| {len(rows)} | {sum(lengths)} | {padded} | {forwards} | {a:.3f} | {b:.3f} | {a / b:.2f}x |")
    continuous.MIN_SAVED_POSITIONS = default
