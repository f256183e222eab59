"""``asyncrl bench --decode``: decode tokens/s of the three ways to generate from one model directory, in one process.

The built-in engine (our decode loop with a KV cache), transformers' ``generate``, and vLLM (``rollout.engine=vllm``,
when the extra is installed; otherwise its row says why it is missing) twice: eager (``rollout.enforce_eager=true``,
the default) and compiled (``false``: torch.compile, whose start-up is in the note). Same model, prompts (chat-templated
questions), batch, new-token count, sampling (temperature 1) and torch threads; every row runs the full
``--new-tokens`` (eos ignored), so each engine does the same work. Each engine is warmed up once and timed
``--repeats`` times; the best run counts. Writes ``decode.json`` and ``decode.md`` under ``--out``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

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


def _best(fn, repeats: int) -> tuple[float, int]:
    """(best seconds, tokens) over ``repeats`` timed calls after one warm-up; ``fn()`` returns tokens generated."""
    fn()
    best, tokens = float("inf"), 0
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = fn()
        best = min(best, time.perf_counter() - start)
    return best, tokens


def run_decode_bench(model_dir: str, out: str, batch: int, new_tokens: int, threads: int, repeats: int) -> list[dict]:
    torch.set_num_threads(threads)
    model, tokenizer = load_model(model_dir, for_training=False)
    prompts = _prompts(tokenizer, batch)
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=new_tokens)
    rows: list[dict] = []

    def record(engine: str, seconds: float, tokens: int, note: str = "") -> None:
        rows.append({"engine": engine, "tokens": tokens, "seconds": round(seconds, 3),
                     "tokens_per_s": round(tokens / seconds, 1) if seconds else None, "note": note})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)

    builtin = RolloutEngine(model, tokenizer, eos_token_ids=[-1], max_batch_size=batch)  # -1: no eos, full length
    record("builtin", *_best(lambda: sum(len(s.response_ids) for s in builtin.generate(prompts, params, 0)), repeats))

    left = max(len(p.prompt_ids) for p in prompts)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (left - len(p.prompt_ids)) + p.prompt_ids for p in prompts])
    mask = torch.tensor([[0] * (left - len(p.prompt_ids)) + [1] * len(p.prompt_ids) for p in prompts])

    def hf_generate() -> int:
        with torch.inference_mode():
            seqs = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                  max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad)  # fmt: skip
        return int(seqs[:, left:].numel())

    record("hf_generate", *_best(hf_generate, repeats))
    try:
        from asyncrl.rollout.vllm_engine import VllmEngine, VllmEngineError, VllmOptions

        def vllm_tokens(engine: VllmEngine) -> int:
            return sum(len(s.response_ids) for s in engine.generate(prompts, params, 0))

        for name, eager in (("vllm", True), ("vllm_compiled", False)):  # rollout.enforce_eager true / false
            options = VllmOptions(max_model_len=left + new_tokens + 8, max_num_seqs=batch, enforce_eager=eager)
            engine = VllmEngine(model_dir, tokenizer, options, ignore_eos=True)
            torch.set_num_threads(threads)
            timed = _best(lambda e=engine: vllm_tokens(e), repeats)
            record(name, *timed, f"enforce_eager={eager}, engine start {engine.start_seconds:.1f} s")
            del engine
    except VllmEngineError as e:
        rows.append({"engine": "vllm", "tokens": 0, "seconds": None, "tokens_per_s": None, "note": str(e)})
    base = {r["engine"]: r["tokens_per_s"] for r in rows}
    for r in rows:
        for ref in ("builtin", "hf_generate"):
            r[f"ratio_to_{ref}"] = round(r["tokens_per_s"] / base[ref], 2) if r["tokens_per_s"] else None
    Path(out).mkdir(parents=True, exist_ok=True)
    setting = {"model": model_dir, "batch": batch, "new_tokens": new_tokens, "threads": threads, "repeats": repeats,
               "prompt_tokens_max": left, "load_avg": os.getloadavg()}  # fmt: skip
    Path(out, "decode.json").write_text(json.dumps({"setting": setting, "rows": rows}, indent=2))
    lines = ["| engine | tokens | seconds | tokens/s | x builtin | x hf_generate | note |", "|" + " --- |" * 7]
    lines += [f"| {r['engine']} | {r['tokens']} | {r['seconds']} | {r['tokens_per_s']} | {r['ratio_to_builtin']} | "
              f"{r['ratio_to_hf_generate']} | {r['note']} |" for r in rows]  # fmt: skip
    Path(out, "decode.md").write_text(json.dumps(setting) + "\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))
    return rows
