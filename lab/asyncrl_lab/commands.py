"""The lab's commands on ``asyncrl``'s command line: ``asyncrl bench``, ``asyncrl demo``, ``asyncrl demo-real``,
``asyncrl probe``.

Registered as ``asyncrl.commands`` entry points (lab/pyproject.toml); ``asyncrl.cli`` calls each ``add_*`` with its
subparsers and imports nothing of the lab by name.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asyncrl_lab.bench_knobs import Latency


def cmd_bench(a: argparse.Namespace) -> None:
    if a.published:
        from asyncrl_lab.perf_published import run_published

        run_published()
        return
    if a.decode:
        from asyncrl_lab.bench_decode import run_decode_bench

        run_decode_bench(a.model, a.out, a.batch, a.new_tokens, a.cpus, a.repeats)
        return
    if a.distill:
        from asyncrl_lab.bench_distill import run_distill_bench

        schedules = [m.strip() for m in (a.schedules or "sync,one_step_off,two_step_off").split(",") if m.strip()]
        run_distill_bench(schedules, a.out, a.steps, a.cpus, a.overrides)
        return
    from asyncrl_lab.bench import run_bench

    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    latencies = bench_latencies(a)
    run_bench(modes, a.workload, a.out, a.steps, a.work_dir, a.cpus, a.sft_seconds, a.overrides, a.predict, latencies)


def bench_latencies(a: argparse.Namespace) -> list[Latency]:
    """The latency settings ``--reward-delay-ms`` / ``--tool-delay-ms`` ask for (``[]``: neither given)."""
    from asyncrl_lab.bench_knobs import latency_settings, parse_delays

    reward = parse_delays(a.reward_delay_ms, "--reward-delay-ms")
    return latency_settings(reward, parse_delays(a.tool_delay_ms, "--tool-delay-ms"), a.workload)


def cmd_demo(a: argparse.Namespace) -> None:
    from asyncrl_lab.demo import run_demo

    run_demo(a.out, sft_steps=a.sft_steps, rl_config=a.config, overrides=a.overrides, seed=a.seed)


def cmd_demo_real(a: argparse.Namespace) -> None:
    from asyncrl_lab.demo_real import run_demo_real

    run_demo_real(a.out, a.overrides)


def cmd_probe(a: argparse.Namespace) -> None:
    from asyncrl_lab.probe import probe_run

    cost = probe_run(a.run_dir)
    out = Path(a.out) if a.out else Path(a.run_dir) / "cost.json"
    cost.save(out)
    print("\n".join(cost.describe()))
    print(f"wrote {out}")


def add_probe(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser(
        "probe",
        help="asyncrl profile, with this machine's thread scaling, prefill, streaming and weight-sync prices measured "
        "on the run's own model, prompts, engine and trainer (a few minutes)",
    )
    s.add_argument("run_dir")
    s.add_argument("--out", default=None, help="where to write the cost model (default RUN_DIR/cost.json)")
    s.set_defaults(fn=cmd_probe)


def add_bench(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser(
        "bench", help="GRPO on each schedule (trainer.schedule) against sync; writes bench.json and bench.md"
    )
    s.add_argument(
        "--modes",
        default="sync_unshared,sync,one_step_off,fully_async",
        help="comma-separated schedules (sync is always run; sync_unshared is sync without prefix sharing or "
        "packing, the baseline of ratio_to_unshared), or the PPO placements ppo_colocated,ppo_split",
    )
    s.add_argument("--distill", action="store_true", help="bench distillation's schedules (configs/distill.yaml)")
    s.add_argument(
        "--published", action="store_true", help="the performance model against peers' published speed-ups (no runs)"
    )
    s.add_argument(
        "--decode", action="store_true", help="decode tokens/s: built-in engine vs transformers generate vs vLLM"
    )
    s.add_argument("--model", default="runs/smollm2", help="with --decode: the model directory")
    s.add_argument("--batch", type=int, default=32, help="with --decode: sequences per batch")
    s.add_argument("--new-tokens", type=int, default=128, help="with --decode: tokens generated per sequence")
    s.add_argument("--repeats", type=int, default=2, help="with --decode: timed runs per engine (best counts)")
    s.add_argument(
        "--schedules",
        "--schedulers",
        dest="schedules",
        default=None,
        help="with --distill: comma-separated trainer.schedule values (default sync,one_step_off,two_step_off; "
        "sync is always run)",
    )
    s.add_argument("--workload", default="demo", choices=["demo", "short", "long", "tail", "tool", "real"])
    s.add_argument(
        "--reward-delay-ms",
        default=None,
        help="comma-separated delays, e.g. 0,20,200: every mode runs once per delay d, the reward served by an HTTP "
        "service on loopback answering after d ms (0, always run: the in-process reward); rows mode@reward<d>ms "
        "with ratio_to_instant",
    )
    s.add_argument(
        "--tool-delay-ms",
        default=None,
        help="with --workload tool: comma-separated delays, e.g. 0,200: every mode runs once per delay d with a calc "
        "tool answering after d ms (0, always run: the built-in calc); rows mode@tool<d>ms with ratio_to_instant",
    )
    s.add_argument("--steps", type=int, default=20, help="training steps per run (the first is left out of rates)")
    s.add_argument("--out", default="runs/bench")
    s.add_argument("--work-dir", default="runs/bench_work", help="cached data + SFT models per workload")
    s.add_argument("--cpus", type=int, default=2, help="CPUs every run gets in total")
    s.add_argument("--sft-seconds", type=float, default=None, help="warm start length when a workload is prepared")
    s.add_argument(
        "--predict",
        default=None,
        help="a cost.json, or 'auto' (profile the sync run, which runs first): predict every run before it starts, "
        "then report the error",
    )
    s.add_argument("overrides", nargs="*", help="dotted key=value overrides applied to every run")
    s.set_defaults(fn=cmd_bench)


def add_demo(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("demo", help="data -> tiny model -> SFT warm start -> RL vs an SFT control; prints a table")
    s.add_argument("--out", default="runs/demo")
    s.add_argument("--sft-steps", type=int, default=None, help="SFT warm-start steps (default: tools.demo.SFT_STEPS)")
    s.add_argument(
        "--config", default="configs/fully_async.yaml", help="the RL run (configs/quickstart.yaml: schedule sync)"
    )
    s.add_argument(
        "--seed", type=int, default=1, help="seed of the SFT start and the RL run (the control: seed + 1; data fixed)"
    )
    s.add_argument("overrides", nargs="*")
    s.set_defaults(fn=cmd_demo)


def add_demo_real(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("demo-real", help="GRPO on SmolLM2-135M-Instruct with vLLM rollouts; before/after table")
    s.add_argument("--out", default="runs/demo_real")
    s.add_argument("overrides", nargs="*", help="dotted key=value overrides of configs/real_grpo.yaml")
    s.set_defaults(fn=cmd_demo_real)
