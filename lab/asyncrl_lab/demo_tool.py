"""``make demo-tool``: does a calculator tool help, trained with the multi-turn tool agent, on the same budget?

The task is sums of two 4-5 digit numbers (chain_sum, ``48213 + 9057 =``), hard for a 0.7M-parameter model to do in
its head and trivial with ``calc``. Two arms start from the same initial weights and get the same budget:

- **single-turn**: SFT on the bare answer, then GRPO with ``single_turn_agent``;
- **tool**: SFT on a tool conversation (the call, the tool's turn, the answer), then GRPO with ``tool_agent`` and
  ``calc`` (configs/tool_agent.yaml).

Same SFT steps and batch, same RL steps, prompts, group size and response budget. Printed: held-out accuracy (greedy,
through each arm's own agent loop) after SFT and after RL, the tool-call rate and turns per sample on held-out
prompts, and each phase's wall time.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from asyncrl.config import load_config
from asyncrl.data.rows import load_rows, write_rows
from asyncrl.data.tasks import write_task_dataset
from asyncrl.finetune.sft import SFTConfig, run_sft
from asyncrl.models.loading import load_model
from asyncrl.models.presets import init_model_dir
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.rollout.agent.format import TurnEncoder
from asyncrl.schedules import run_training
from asyncrl.telemetry.metrics import read_metrics

TASK = {"min_terms": 2, "max_terms": 2, "min_digits": 4, "max_digits": 5}


def tool_call(expression: str) -> str:
    return "<tool_call>" + json.dumps({"name": "calc", "arguments": {"expression": expression}}) + "</tool_call>"


def make_data(out: Path, size: int, test_size: int) -> tuple[Path, Path, Path]:
    """The task's parquet files, and a shared initial model whose char tokenizer covers the tool conversation; each
    training row gets ``extra_info.tool_solution`` (the tool arm's SFT target, in that tokenizer's chat format)."""
    train, test = write_task_dataset(
        "chain_sum", size, 0, out / "data", test_size=test_size, prompt_template="{expression} =", **TASK
    )
    rows = load_rows(train)
    exprs = [json.loads(r["extra_info"]["metadata"])["expression"] for r in rows]
    texts = [m["content"] for r in rows for m in r["prompt"]] + [tool_call(e) for e in exprs[:50]] + ["0123456789"]
    tok = build_char_tokenizer(texts)
    init = out / "init"
    init_model_dir("mini", tok, init, seed=0)
    encoder = TurnEncoder(tok)
    for r, e in zip(rows, exprs):
        answer = str(r["reward_model"]["ground_truth"])
        r["extra_info"]["tool_solution"] = tool_call(e) + tok.eos_token + encoder.text([answer]) + answer
    write_rows(train, list(rows))
    return train, test, init


def sft(init: Path, train: Path, out: Path, key: str, steps: int, lr: float, batch: int) -> float:
    cfg = SFTConfig()
    cfg.optim.lr, cfg.data.batch_size = lr, batch
    cfg.model.path = str(init)
    cfg.data.train_files, cfg.data.response_key, cfg.data.max_response_length = [str(train)], key, 128
    cfg.trainer.total_steps, cfg.trainer.output_dir, cfg.trainer.log_every = steps, str(out), 100
    cfg.optim.lr_schedule = "cosine"
    t0 = time.time()
    run_sft(cfg)
    return time.time() - t0


def rl(config: str, model: Path, run_dir: Path, agent: str, steps: int, extra: list[str]) -> dict[str, Any]:
    over = [
        f"model.path={model}",
        f"trainer.default_local_dir={run_dir}",
        f"rollout.agent.default_agent_loop={agent}",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={steps}",
        f"trainer.save_freq={steps}",
        *extra,
    ]
    t0 = time.time()
    summary = run_training(load_config(config, over))
    metrics = read_metrics(run_dir / "metrics.jsonl")
    trained = [m for m in metrics if m["step"] >= 1]
    return {
        "accuracy_sft": summary.get("accuracy_before"),
        "accuracy_rl": summary.get("accuracy_after"),
        "train_tool_call_rate": sum(m.get("agent/tool_call_rate", 0.0) for m in trained) / max(len(trained), 1),
        "train_turns_mean": sum(m.get("agent/turns_mean", 1.0) for m in trained) / max(len(trained), 1),
        "train_reward_first": trained[0]["reward/mean"] if trained else None,
        "train_reward_last": trained[-1]["reward/mean"] if trained else None,
        "rl_wall_s": round(time.time() - t0, 1),
    }


def held_out_tool_use(model_dir: Path, test: Path, n: int = 200) -> dict[str, float]:
    """Greedy rollouts of the trained tool model on held-out prompts: tool-call rate and turns per sample."""
    from asyncrl.config.rollout import MultiTurnConfig
    from asyncrl.data.dataset import PromptDataset
    from asyncrl.rollout.agent.engine import AgentEngine
    from asyncrl.rollout.engine import RolloutEngine
    from asyncrl.rollout.sampling import SamplingParams
    from asyncrl.run.step_log import agent_metrics

    model, tok = load_model(model_dir, for_training=False)
    engine = AgentEngine(
        RolloutEngine(model, tok), MultiTurnConfig(tools=["calc"], max_assistant_turns=3), "tool_agent"
    )
    ds = PromptDataset(load_rows(test)[:n], tok, 64)
    out = engine.generate([ds[i] for i in range(len(ds))], SamplingParams(n=1, temperature=0.0, max_new_tokens=128))
    m = agent_metrics(out)
    return {
        "held_out_tool_call_rate": m.get("agent/tool_call_rate", 0.0),
        "held_out_turns_mean": m.get("agent/turns_mean", 1.0),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/demo_tool")
    p.add_argument("--config", default="configs/tool_agent.yaml")
    p.add_argument("--size", type=int, default=4000)
    p.add_argument("--test-size", type=int, default=200)
    p.add_argument("--sft-steps", type=int, default=1500)
    p.add_argument("--sft-lr", type=float, default=2e-3)
    p.add_argument("--sft-batch", type=int, default=32)
    p.add_argument("--rl-steps", type=int, default=10)
    a = p.parse_args(argv)
    out = Path(a.out)
    train, test, init = make_data(out, a.size, a.test_size)
    data = [f"data.train_files=[{train}]", f"data.val_files=[{test}]"]
    report: dict[str, Any] = {"task": TASK, "sft": [a.sft_steps, a.sft_lr, a.sft_batch], "rl_steps": a.rl_steps}
    for arm, key, agent in [
        ("single_turn", "ground_truth", "single_turn_agent"),
        ("tool", "tool_solution", "tool_agent"),
    ]:
        sft_dir = out / f"sft_{arm}"
        res = {"sft_wall_s": round(sft(init, train, sft_dir, key, a.sft_steps, a.sft_lr, a.sft_batch), 1)}
        res.update(rl(a.config, sft_dir, out / f"rl_{arm}", agent, a.rl_steps, data))
        if arm == "tool":
            res.update(held_out_tool_use(out / f"rl_{arm}" / "final", test, a.test_size))
        report[arm] = res
        print(f"[demo-tool] {arm}: {json.dumps(res)}", flush=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    for arm in ("single_turn", "tool"):
        r = report[arm]
        print(f"[demo-tool] {arm:11s} held-out accuracy: SFT {r['accuracy_sft']:.1%} -> RL {r['accuracy_rl']:.1%}")
    t = report["tool"]
    print(
        f"[demo-tool] tool arm: held-out tool-call rate {t['held_out_tool_call_rate']:.1%}, "
        f"turns per sample {t['held_out_turns_mean']:.2f}"
    )
    return report


if __name__ == "__main__":
    main()
