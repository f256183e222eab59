"""``make demo``: the whole story on the built-in default task, in one command.

chain_sum data -> a tiny Qwen2 with a character tokenizer -> a short SFT warm start -> GRPO with
``configs/fully_async.yaml`` (``--config configs/quickstart.yaml`` for the sync schedule) -> a control that simply
continues SFT for the same wall time as the RL run -> a table of held-out accuracy. The control is what makes the RL
gain mean something: it answers "would more supervised training have done as well in the same time?".
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from asyncrl.config import load_config
from asyncrl.data.tasks import write_task_dataset
from asyncrl.finetune.sft import evaluate_model, load_sft_config, run_sft
from asyncrl.models.loading import load_model
from asyncrl.types import Prompt

TASK = "chain_sum"
TASK_KWARGS = {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}
TRAIN_SIZE, TEST_SIZE = 20000, 500
# ~320 s on 2 cores: short on purpose, so that RL has room. The lr stays constant (configs/sft_tiny.yaml), so greedy
# accuracy still swings by several points between nearby steps; a cosine decay settles it far higher (52.6% at 900
# steps) but leaves GRPO at lr 1e-4 nothing to add (it fell to 48.4% in 40 steps). BENCHMARKS.md has the runs.
SFT_STEPS = 900
PROMPT_TEMPLATE = "{expression} ="  # the bare expression: same task and scorer, ~5x fewer tokens than the question


def run_demo(
    out: str, sft_steps: int | None, rl_config: str, overrides: list[str] | None = None, seed: int = 1
) -> dict:
    t_start = time.time()
    sft_steps = SFT_STEPS if sft_steps is None else sft_steps
    root = Path(out)
    data_dir = root / "data"
    train, test = write_task_dataset(
        TASK, TRAIN_SIZE, 0, data_dir, test_size=TEST_SIZE, prompt_template=PROMPT_TEMPLATE, **TASK_KWARGS
    )
    print(f"[demo] data: {train} ({TRAIN_SIZE} rows), {test} ({TEST_SIZE} held-out rows)")

    sft_dir = root / "sft"
    sft_over = [
        f"data.train_files=[{train}]",
        f"data.val_files=[{test}]",
        f"trainer.output_dir={sft_dir}",
        f"trainer.total_steps={sft_steps}",
        # a step budget, not a time cap: the start (and the control's room) is the same on every machine
        "trainer.max_time_s=0",
        f"trainer.seed={seed}",
    ]
    print(f"[demo] SFT warm start for {sft_steps} steps ...")
    sft = run_sft(load_sft_config("configs/sft_tiny.yaml", sft_over), group_of=_difficulty)
    print(f"[demo] SFT: {sft['steps']} steps in {sft['train_s']:.0f} s, held-out accuracy {sft['accuracy']:.3f}")

    from asyncrl.schedules import run_training
    from asyncrl.workers.cluster import shutdown

    rl_dir = root / "rl"
    rl_over = [
        f"model.path={sft_dir}",
        f"data.train_files=[{train}]",
        f"data.val_files=[{test}]",
        f"trainer.default_local_dir={rl_dir}",
        "trainer.resume_mode=disable",
        f"trainer.seed={seed}",
        *(overrides or []),
    ]
    cfg = load_config(rl_config, rl_over)
    print(
        f"[demo] RL ({cfg.algorithm.name}, schedule {cfg.trainer.schedule}) for {cfg.trainer.total_training_steps} "
        "steps ..."
    )
    rl = run_training(cfg)
    shutdown()

    ctrl_dir = root / "sft_control"
    ctrl_over = [
        f"model.path={sft_dir}",
        f"data.train_files=[{train}]",
        f"data.val_files=[{test}]",
        f"trainer.output_dir={ctrl_dir}",
        f"trainer.max_time_s={rl['wall_s']}",
        "trainer.total_steps=1000000",
        f"trainer.seed={seed + 1}",  # its own data order: not a replay of the warm start's batches
    ]
    print(f"[demo] control: SFT continued for the RL run's wall time ({rl['wall_s']:.0f} s) ...")
    ctrl = run_sft(load_sft_config("configs/sft_tiny.yaml", ctrl_over), group_of=_difficulty)

    # Where the gains come from: held-out accuracy of each model by difficulty (terms x digits of the chain sum). The
    # two SFT runs report it from their own final evaluation; the RL run evaluates inside its workers, so its final
    # model is evaluated once more here.
    model, tok = load_model(str(rl["final_model"]))
    rl_groups = evaluate_model(model, tok, [str(test)], 16, TEST_SIZE, group_of=_difficulty)["by_group"]
    by_difficulty = {"sft": sft["by_group"], "rl": rl_groups, "control": ctrl["by_group"]}

    result = {
        "heldout_n": TEST_SIZE,
        "seed": seed,
        "sft_steps": sft["steps"],
        "sft_wall_s": sft["train_s"],
        "sft_start_accuracy": sft["accuracy"],
        "rl_algorithm": cfg.algorithm.name,
        "rl_schedule": cfg.trainer.schedule,
        "rl_accuracy": rl["accuracy_after"],
        "rl_wall_s": rl["wall_s"],
        "control_accuracy": ctrl["accuracy"],
        "control_wall_s": ctrl["train_s"],
        "by_difficulty": by_difficulty,
        "total_wall_s": round(time.time() - t_start, 1),
    }
    (root / "demo_summary.json").write_text(json.dumps(result, indent=2) + "\n")
    _print_table(result)
    return result


def _difficulty(prompt: Prompt) -> str:
    meta = json.loads(prompt.extra_info["metadata"])
    return f"{meta['num_terms']}x{meta['num_digits']}d"


def _print_table(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    groups = list(r["by_difficulty"]["sft"])
    sizes = ", ".join(f"{g} {r['by_difficulty']['sft'][g][1]}" for g in groups)
    t = Table(
        title=f"asyncrl demo: chain_sum, held-out accuracy on {r['heldout_n']} items (greedy)",
        caption=f"by difficulty: 2x1d = 2 terms of 1 digit, ...; items per column: {sizes}",
    )
    for col in ("model", "accuracy", "vs start", "wall s", *groups):
        t.add_column(col, justify="left" if col == "model" else "right", no_wrap=True)
    base = r["sft_start_accuracy"]
    rows = (
        ("sft", f"SFT start ({r['sft_steps']} steps)", base, f"{r['sft_wall_s']:.0f}"),
        ("rl", f"+ {r['rl_algorithm'].upper()} {r['rl_schedule']}", r["rl_accuracy"], f"+{r['rl_wall_s']:.0f}"),
        ("control", "+ SFT (control)", r["control_accuracy"], f"+{r['control_wall_s']:.0f}"),
    )
    for key, label, acc, wall in rows:
        gain = "" if key == "sft" else f"{(acc - base) * 100:+.1f} pts"
        per = [f"{r['by_difficulty'][key][g][0]:.0%}" for g in groups]
        t.add_row(label, f"{acc:.1%}", gain, wall, *per)
    Console(width=max(100, Console().width)).print(t)
    print(f"total demo wall time: {r['total_wall_s']:.0f} s")
