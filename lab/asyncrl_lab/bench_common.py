"""What every bench shares: the workloads (data + an SFT-warmed tiny model), the overrides of a benched run, one
run of ``run_training``, the step metrics a summary is computed from, the trainer's idle fraction and the output
files (``<stem>.json`` and a markdown table in ``<stem>.md``). Imported by ``bench``, ``bench_ppo`` and
``bench_distill``; it imports none of them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.data.tasks import write_task_dataset
from asyncrl.telemetry.metrics import read_metrics
from asyncrl.telemetry.timeline import idle_fraction


@dataclass
class Workload:
    name: str
    sft_seconds: float
    sft_overrides: list[str]
    train_overrides: list[str]
    files: dict[str, list[str]]

    def data_overrides(self) -> list[str]:
        return [
            f"data.train_files=[{','.join(self.files['train'])}]",
            f"data.val_files=[{','.join(self.files['val'])}]",
        ]


def _chain_sum(out: Path, size: int, seed: int, test_size: int, terms: tuple[int, int]) -> tuple[Path, Path]:
    """chain_sum problems of ``terms`` (min, max) terms of 1-2 digits each, phrased as the demo's are."""
    return write_task_dataset(
        "chain_sum",
        size,
        seed,
        out,
        test_size=test_size,
        prompt_template="{expression} =",
        min_terms=terms[0],
        max_terms=terms[1],
        min_digits=1,
        max_digits=2,
    )


def _mixed_targets(path: Path, seed: int) -> Path:
    """``path`` with ``extra_info.mixed``: for each row, at random, its step-by-step solution or its bare answer
    (``#### N``); a model SFT-trained on it answers the same prompt either way, so a group's responses differ in
    length by 10x and more (the ``tail`` workload)."""
    import random

    import pyarrow.parquet as pq

    rng = random.Random(seed)
    rows = pq.read_table(path).to_pylist()
    for r in rows:
        info = r["extra_info"]
        info["mixed"] = info["solution"] if rng.random() < 0.5 else f"#### {info['answer']}"
    out = path.with_name(path.stem + "_mixed.parquet")
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(rows), out)
    return out


def prepare_workload(name: str, work_dir: Path, sft_seconds: float | None) -> Workload:
    """Data and an SFT-warmed tiny model for ``name``, built once under ``work_dir`` and reused by later benches.

    ``demo`` is the demo's RL work (configs/quickstart.yaml: 32 prompts x 8 samples of at most 16 tokens; short
    answers, so update-heavy on a CPU); ``short`` is the same task, data and model at half the batch; ``long`` is
    chain_sum with 2-24 terms answered step by step (running sums), a generation-heavy workload with a long tail of
    response lengths; ``tail`` is chain_sum with 10-16 terms, each SFT target at random the step-by-step solution or
    the bare answer, so the responses to one prompt range from a few tokens to a couple of hundred (a long tail within
    every group: where a Rollouter that streams gains most); ``tool`` is demo-tool's work (sums of two 4-5 digit
    numbers that the model hands to ``calc`` through the tool agent, configs/tool_agent.yaml) at 8 prompts x 4, after
    a 180 s SFT on the tool conversation (measured: a call in every held-out answer, 89% right at temperature 1; after
    60 s the model called calc with made-up numbers, every reward was 0 and every advantage with it): where a tool's
    latency shows (``--tool-delay-ms``).
    """
    from asyncrl.finetune.sft import load_sft_config, run_sft

    wdir = work_dir / ("short" if name == "demo" else name)
    if name in ("short", "demo"):
        train, test = _chain_sum(wdir / "data", 20000, 0, 200, terms=(2, 3))
        files = {"train": [str(train)], "val": [str(test)]}
        sft_over = ["data.max_response_length=16"]
        # demo: configs/quickstart.yaml's own batch (32 prompts x 8); short: half of it
        train_over = ["rollout.response_length=16"]
        if name == "short":
            train_over += ["data.train_batch_size=16", "actor.ppo_mini_batch_size=16"]
        secs = 60.0 if sft_seconds is None else sft_seconds
    elif name == "long":
        # A long tail of response lengths: most problems have 2-6 terms, a quarter have 12-24.
        short_tr, short_te = _chain_sum(wdir / "data_short", 6000, 0, 150, terms=(2, 6))
        long_tr, long_te = _chain_sum(wdir / "data_long", 2000, 1, 50, terms=(12, 24))
        files = {"train": [str(short_tr), str(long_tr)], "val": [str(short_te), str(long_te)]}
        sft_over = ["data.response_key=solution", "data.max_response_length=256", "data.batch_size=16"]
        # 2 prompts x 4 samples per step: the arrangement where generation dominates the step on a 2-core CPU
        # (measured: 0.75 s generating vs 0.43 s training in sync); with 64 samples per step training dominates.
        train_over = [
            "rollout.response_length=256",
            "rollout.n=4",
            "data.train_batch_size=2",
            "actor.ppo_mini_batch_size=2",
            "actor.ppo_micro_batch_size=32",
            "data.max_prompt_length=192",
        ]
        secs = 180.0 if sft_seconds is None else sft_seconds
    elif name == "tail":
        train, test = _chain_sum(wdir / "data", 6000, 2, 100, terms=(10, 16))
        train, test = _mixed_targets(train, 0), _mixed_targets(test, 1)
        files = {"train": [str(train)], "val": [str(test)]}
        sft_over = ["data.response_key=mixed", "data.max_response_length=256", "data.batch_size=16"]
        # 8 prompts x 4 samples a step: a sync window of 8 groups, so a Rollouter one window ahead holds up to 16
        # groups (64 rows) whose lengths range over 10x and more
        train_over = [
            "rollout.response_length=256",
            "rollout.n=4",
            "data.train_batch_size=8",
            "actor.ppo_mini_batch_size=8",
            "actor.ppo_micro_batch_size=32",
            "data.max_prompt_length=192",
        ]
        secs = 180.0 if sft_seconds is None else sft_seconds
    elif name == "tool":
        files, init = _tool_data(wdir)
        sft_over = [f"model.path={init}", *TOOL_SFT_OVERRIDES]
        train_over = list(TOOL_TRAIN_OVERRIDES)
        secs = 180.0 if sft_seconds is None else sft_seconds
    elif name == "real":
        return _real_workload(wdir)
    else:
        raise ValueError(f"bench: unknown workload {name!r} (allowed: {', '.join(WORKLOADS)})")
    model_dir = wdir / "sft"
    if not (model_dir / "config.json").is_file():
        print(f"[bench] preparing workload {name!r}: SFT warm start for {secs:.0f} s -> {model_dir}")
        run_sft(
            load_sft_config(
                "configs/sft_tiny.yaml",
                [
                    f"data.train_files=[{','.join(files['train'])}]",
                    f"data.val_files=[{','.join(files['val'])}]",
                    f"trainer.output_dir={model_dir}",
                    f"trainer.max_time_s={secs}",
                    "trainer.total_steps=1000000",
                    "data.val_max_samples=100",
                    *sft_over,
                ],
            )
        )
    return Workload(name, secs, sft_over, [f"model.path={model_dir}", *train_over], files)


WORKLOADS = ("demo", "short", "long", "tail", "tool", "real")
# tool: demo-tool's SFT (make demo-tool: a cosine schedule from 2e-3, 32 conversations a step), cut by time
TOOL_SFT_OVERRIDES = [
    "data.response_key=tool_solution",
    "data.max_response_length=128",
    "data.max_prompt_length=64",
    "data.batch_size=32",
    "optim.lr=2.0e-3",
    "optim.lr_schedule=cosine",
]
# configs/tool_agent.yaml's agent (calc, 3 assistant turns, tool output cut to 64 characters) at 8 prompts x 4
TOOL_TRAIN_OVERRIDES = [
    "rollout.agent.default_agent_loop=tool_agent",
    "rollout.multi_turn.tools=[calc]",
    "rollout.multi_turn.max_assistant_turns=3",
    "rollout.multi_turn.max_tool_response_length=64",
    "rollout.response_length=128",
    "rollout.n=4",
    "data.train_batch_size=8",
    "data.max_prompt_length=64",
    "actor.ppo_mini_batch_size=8",
]


def _tool_data(wdir: Path) -> tuple[dict[str, list[str]], Path]:
    """demo-tool's data at half its size (sums of two 4-5 digit numbers, each training row with its tool conversation
    in ``extra_info.tool_solution``) and its initial model, whose char tokenizer covers the conversation."""
    from asyncrl_lab.demo_tool import make_data

    train, test, init = wdir / "data" / "train.parquet", wdir / "data" / "test.parquet", wdir / "init"
    if not (wdir / "sft" / "config.json").is_file():  # made afresh with the model that learns from it
        train, test, init = make_data(wdir, 2000, 100)
    return {"train": [str(train)], "val": [str(test)]}, init


def _real_workload(wdir: Path) -> Workload:
    """``real``: make demo-real's work (SmolLM2-135M-Instruct, configs/real_grpo.yaml's batch, task and reward), no
    warm start: the pretrained model is the start."""
    from asyncrl.config import load_config
    from asyncrl_lab import real_task as d

    train, test = d.prepare(wdir / "data")
    c = load_config(d.CONFIG, [])  # the demo's own batch, lengths, reward and lr, read from its config
    train_over = [
        f"model.path={d.MODEL_DIR}",
        f"data.train_batch_size={c.data.train_batch_size}",
        f"actor.ppo_mini_batch_size={c.actor.ppo_mini_batch_size}",
        f"rollout.response_length={c.rollout.response_length}",
        f"reward.custom_function={c.reward.custom_function}",
        f"actor.optim.lr={c.actor.optim.lr}",
        f"data.max_prompt_length={c.data.max_prompt_length}",
        f"rollout.max_num_seqs={c.rollout.max_num_seqs}",
        "weight_sync.timeout_s=120",
    ]
    return Workload("real", 0.0, [], train_over, {"train": [str(train)], "val": [str(test)]})


def run_overrides(run_dir: Path, steps: int) -> list[str]:
    """What every benched run shares: a fresh run dir, ``steps`` steps, no evaluation, one checkpoint, jsonl metrics."""
    return [
        f"trainer.default_local_dir={run_dir}",
        f"trainer.total_training_steps={steps}",
        "trainer.resume_mode=disable",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        f"trainer.save_freq={steps}",
        "trainer.logger=[console,jsonl]",
    ]


def run_one(cfg: Any) -> dict[str, Any]:
    """One training run, then a fresh cluster for the next one."""
    from asyncrl.schedules import run_training
    from asyncrl.workers.cluster import shutdown

    summary = run_training(cfg)
    shutdown()
    return summary


def step_metrics(run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(every training step's metrics, the measured ones). The first step pays one-off costs (first generation,
    allocator warm-up), so it is left out of the measured steps when there are more than two."""
    steps = [m for m in read_metrics(run_dir / "metrics.jsonl") if m["step"] >= 1 and "timing_s/step" in m]
    return steps, (steps[1:] if len(steps) > 2 else steps)


def trainer_idle_fraction(events: list[dict[str, Any]], body: list[dict[str, Any]]) -> float | None:
    """The share of the measured window (start of the first measured step to the end of the last train call) in which
    the worker that trains (the one, besides the driver, that records ``update_actor`` spans) ran no busy span; None
    when the timeline does not name exactly one such worker."""
    updates = [e for e in events if e["name"] == "update_actor"]
    workers = sorted({e["worker"] for e in updates if e["worker"] != "driver"})
    if len(workers) != 1:
        print(f"[bench] no idle fraction: workers with update_actor spans besides the driver: {workers}")
        return None
    driver = [e for e in events if e["worker"] == "driver"]
    t0 = min(e["start_s"] for e in driver if e.get("step") == body[0]["step"])
    t1 = max(e["end_s"] for e in driver if e["name"] == "train")  # the driver's round trip of the last update
    return idle_fraction(events, workers[0], t0, t1)


def cpu_utilization(steps: list[dict[str, Any]], body: list[dict[str, Any]]) -> float | None:
    """The share of the machine's cores kept busy from the end of the step before the measured ones to the end of the
    last (``perf/machine_busy_core_s`` against ``perf/monotonic_s``); None without those readings. On an otherwise
    idle machine, ``1 / cpu_utilization`` of the sync run is the most any schedule doing the same CPU work can gain
    on these cores, however well it overlaps."""
    first = steps.index(body[0])
    key, clock = "perf/machine_busy_core_s", "perf/monotonic_s"
    if first == 0 or key not in steps[first - 1] or key not in body[-1]:
        return None
    busy = body[-1][key] - steps[first - 1][key]
    wall = body[-1][clock] - steps[first - 1][clock]
    return busy / (wall * (os.cpu_count() or 1)) if wall > 0 else None


def mean_of(body: list[dict[str, Any]], key: str) -> float:
    """Mean of ``key`` over the measured steps (0 where a step did not log it)."""
    return sum(m.get(key, 0.0) for m in body) / len(body)


def rate(body: list[dict[str, Any]], key: str) -> float:
    """A per-second rate over the measured steps together: the sum of rate x step seconds over the sum of seconds."""
    return sum(m[key] * m["timing_s/step"] for m in body) / sum(m["timing_s/step"] for m in body)


def write_results(
    results: list[dict[str, Any]], out_dir: Path, stem: str, columns: list[tuple[str, str]], first: str = "workload"
) -> str:
    """Stamp the 1-minute load average on every row (the machine is shared), write ``<stem>.json`` and
    ``<stem>.md`` under ``out_dir``, print the table and return it."""
    load = os.getloadavg()
    for r in results:
        r["loadavg_1m"] = round(load[0], 2)
    (out_dir / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown_table(results, columns, first=first)
    (out_dir / f"{stem}.md").write_text(table)
    print(table)
    return table


def set_ratios(res: dict[str, Any], ref: dict[str, Any], overlap_limit: float) -> None:
    """``res``'s RATE_COLUMNS ratios against the baseline run ``ref`` of the same invocation: its samples/s over
    ``ref``'s, the overlap limit, and the fraction of that limit reached."""
    res["overlap_limit"] = overlap_limit
    res["ratio_to_sync"] = res["samples_per_s"] / ref["samples_per_s"]
    res["limit_fraction"] = res["ratio_to_sync"] / overlap_limit


# The throughput columns every bench against a baseline run reports first.
RATE_COLUMNS = [
    ("samples_per_s", "{:.1f}"),
    ("tokens_per_s", "{:.0f}"),
    ("ratio_to_sync", "{:.2f}x"),
    ("overlap_limit", "{:.2f}x"),
    ("limit_fraction", "{:.2f}"),
]


def markdown_table(results: list[dict[str, Any]], columns: list[tuple[str, str]], first: str = "workload") -> str:
    """One row per result: ``first``, then each ``(key, format)`` column ("-" where the value is None or absent)."""
    head = f"| {first} | " + " | ".join(c for c, _ in columns) + " |"
    sep = "|" + " --- |" * (len(columns) + 1)
    rows = []
    for r in results:
        cells = [str(r[first])] + [("-" if r.get(c) is None else f.format(r[c])) for c, f in columns]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join([head, sep, *rows]) + "\n"
