"""``asyncrl bench --decode``: decode tokens/s of the three ways to generate from one model directory, in one process.

The built-in engine (our decode loop with a KV cache), transformers' ``generate``, and vLLM (``rollout.engine=vllm``,
when the extra is installed; otherwise its row says why it is missing) twice: eager (``rollout.enforce_eager=true``,
the default) and compiled (``false``: torch.compile, whose start-up is in the note). Same model, prompts (chat-templated
questions), batch, new-token count, sampling (temperature 1) and torch threads; every row runs the full
``--new-tokens`` (eos ignored), so each engine does the same work. Each engine is warmed up once, then the engines
take turns ``--repeats`` times (one run each per round); each engine's best run counts. Writes ``decode.json`` and
``decode.md`` under ``--out``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from asyncrl.models.loading import load_model
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Prompt

QUESTIONS = [
    "What is {a} + {b}?",
    "Name a colour that starts with the letter {c}.",
    "Write one sentence about the number {a}.",
    "Is {a} larger than {b}? Answer yes or no.",
]


def _prompts(tokenizer, batch: int) -> list[Prompt]:
    out = []
    for i in range(batch):
        text = QUESTIONS[i % len(QUESTIONS)].format(a=i * 7 % 50, b=i * 13 % 40, c="ABCDEFG"[i % 7])
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        ids = ids["input_ids"] if not isinstance(ids, list) else ids
        out.append(Prompt(i, list(ids), "bench", ""))
    return out


def _interleaved(engines: dict[str, Callable[[], int]], repeats: int) -> dict[str, tuple[float, int, list[float]]]:
    """Name -> (best seconds, tokens, every timed run) after one warm-up each. The engines take turns within each of
    ``repeats`` rounds, so a machine that slows down or speeds up during the bench shifts every engine alike and the
    ratios stay fair (timing one engine's runs after another's put each in a different stretch of the machine's
    noise: up to 12% between back-to-back runs here)."""
    tokens = {name: fn() for name, fn in engines.items()}
    runs: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(repeats):
        for name, fn in engines.items():
            start = time.perf_counter()
            tokens[name] = fn()
            runs[name].append(time.perf_counter() - start)
    return {name: (min(runs[name]), tokens[name], runs[name]) for name in engines}


def run_decode_bench(model_dir: str, out: str, batch: int, new_tokens: int, threads: int, repeats: int) -> list[dict]:
    torch.set_num_threads(threads)
    model, tokenizer = load_model(model_dir, for_training=False)
    prompts = _prompts(tokenizer, batch)
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=new_tokens)
    builtin = RolloutEngine(model, tokenizer, eos_token_ids=[-1], max_batch_size=batch)  # -1: no eos, full length
    left = max(len(p.prompt_ids) for p in prompts)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (left - len(p.prompt_ids)) + p.prompt_ids for p in prompts])
    mask = torch.tensor([[0] * (left - len(p.prompt_ids)) + [1] * len(p.prompt_ids) for p in prompts])

    def hf_generate() -> int:
        with torch.inference_mode():
            seqs = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=pad,
            )
        return int(seqs[:, left:].numel())

    def decoded(engine: Any) -> Callable[[], int]:
        """A run of ``engine`` (the built-in or a vLLM one: the same ``generate``) on the bench's work: its tokens."""
        return lambda: sum(len(s.response_ids) for s in engine.generate(prompts, params, 0))

    engines: dict[str, Callable[[], int]] = {
        "builtin": decoded(builtin),
        "hf_generate": hf_generate,
    }
    notes = dict.fromkeys(engines, "")
    missing = None
    try:
        from asyncrl.rollout.vllm_engine import VllmEngine, VllmEngineError, VllmOptions

        for name, eager in (("vllm", True), ("vllm_compiled", False)):  # rollout.enforce_eager true / false
            options = VllmOptions(max_model_len=left + new_tokens + 8, max_num_seqs=batch, enforce_eager=eager)
            engine = VllmEngine(model_dir, tokenizer, options, ignore_eos=True)
            engines[name] = decoded(engine)
            notes[name] = f"enforce_eager={eager}, engine start {engine.start_seconds:.1f} s"
    except VllmEngineError as e:
        missing = str(e)
    rows: list[dict] = []
    for name, (seconds, tokens, runs) in _interleaved(engines, repeats).items():
        rows.append(
            {
                "engine": name,
                "tokens": tokens,
                "seconds": round(seconds, 3),
                "tokens_per_s": round(tokens / seconds, 1),
                "runs_s": [round(r, 2) for r in runs],
                "note": notes[name],
            }
        )
    if missing is not None:
        rows.append({"engine": "vllm", "tokens": 0, "seconds": None, "tokens_per_s": None, "note": missing})
    base = {r["engine"]: r["tokens_per_s"] for r in rows}
    for r in rows:
        for ref in ("builtin", "hf_generate"):
            r[f"ratio_to_{ref}"] = round(r["tokens_per_s"] / base[ref], 2) if r["tokens_per_s"] else None
    Path(out).mkdir(parents=True, exist_ok=True)
    setting = {
        "model": model_dir,
        "batch": batch,
        "new_tokens": new_tokens,
        "threads": threads,
        "repeats": repeats,
        "prompt_tokens_max": left,
        "load_avg": os.getloadavg(),
    }
    Path(out, "decode.json").write_text(json.dumps({"setting": setting, "rows": rows}, indent=2))
    head = "| engine | tokens | best s | tokens/s | x builtin | x hf_generate | every run s | note |"
    lines = [head, "|" + " --- |" * 8]
    lines += [
        f"| {r['engine']} | {r['tokens']} | {r['seconds']} | {r['tokens_per_s']} | {r['ratio_to_builtin']} | "
        f"{r['ratio_to_hf_generate']} | {r.get('runs_s', '')} | {r['note']} |"
        for r in rows
    ]
    Path(out, "decode.md").write_text(json.dumps(setting) + "\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))
    return rows
