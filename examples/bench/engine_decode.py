"""The built-in engine's decode tokens/s in one process: ``tiny`` (the demo's initial model, ``runs/tiny_init``) or
``smol`` (SmolLM2-135M's shape from ``tests/fixtures``, randomly initialised, the demo tokenizer's vocabulary);
``BATCH`` rows of random prompts (8-16 tokens), ``NEW`` tokens each (eos off), sampled at temperature 1, two torch
threads; the best of three calls after a warm-up. From the repo root (``make setup`` made ``runs/tiny_init``):
``HF_HUB_OFFLINE=1 .venv/bin/python examples/bench/engine_decode.py tiny 64 128``; to compare two checkouts, run it
in turns with ``PYTHONPATH=CHECKOUT``.
"""

from __future__ import annotations

import json
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from asyncrl.models.loading import load_model, load_tokenizer_from
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Prompt

kind, batch, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(2)
tok = load_tokenizer_from("runs/tiny_init")
if kind == "tiny":
    model = load_model("runs/tiny_init")[0]
else:
    cfg = AutoConfig.from_pretrained("tests/fixtures/models/smollm2-135m")
    cfg.vocab_size = len(tok)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).float()
model.eval()
g = torch.Generator().manual_seed(0)
prompts = [
    Prompt(
        index=i,
        prompt_ids=torch.randint(5, len(tok), (int(8 + i % 9),), generator=g).tolist(),
        data_source="t",
        ground_truth="",
    )
    for i in range(batch)
]
engine = RolloutEngine(model, tok, eos_token_ids=[-1], max_batch_size=batch)
params = SamplingParams(n=1, temperature=1.0, max_new_tokens=new)
engine.generate(prompts[:4], params, 0)
best = 0.0
for r in range(3):
    t0 = time.perf_counter()
    n = sum(len(s.response_ids) for s in engine.generate(prompts, params, r))
    best = max(best, n / (time.perf_counter() - t0))
print(json.dumps({"kind": kind, "tokens_per_s": best}))
