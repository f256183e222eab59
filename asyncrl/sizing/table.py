"""The memory plan as ``asyncrl plan --model`` prints it: one row per layout shown (each role's GB per GPU, marked
where it does not fit), then every term of the layout the config itself asks for."""

from __future__ import annotations

import copy

from asyncrl.config import Config
from asyncrl.sizing.memory import GB, MemoryPlan, Terms, plan_memory
from asyncrl.sizing.shape import ModelShape


def _gb(x: int) -> str:
    return f"{x / GB:.1f}"


def format_memory(cfg: Config, shape: ModelShape, layouts: list[tuple[str, str, int]], device_bytes: int | None) -> str:
    """``layouts``: (how the table names it, schedule, trainer GPUs): the rollout's GPUs change no role's bytes."""
    d = f"{device_bytes / GB:.0f} GB" if device_bytes is not None else "unknown size"
    lines = [
        f"memory per GPU: {cfg.model.path} ({shape.params / 1e9:.2f}B parameters), trainer.strategy="
        f"{cfg.trainer.strategy}, model.dtype={cfg.model.dtype}, rollout.engine={cfg.rollout.engine}; GPUs of {d}",
        "",
        "| layout | trainer GB/GPU | rollout GB/GPU | rollout KV GB | fits |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, schedule, trainer in layouts:
        c = copy.deepcopy(cfg)  # cfg's plan with its schedule and trainer ranks replaced by the layout's
        c.trainer.schedule = schedule
        p = plan_memory(c, shape, device_bytes, trainer_ranks=trainer)
        r = p.rollout
        problems = p.problems()
        fits = "yes" if not problems else "NO: " + "; ".join(problems)
        rollout = "-" if r is None else _gb(r.total)
        kv = "-" if r is None else _gb(r.kv_cache)
        lines.append(f"| {label} | {_gb(p.trainer.total)} | {rollout} | {kv} | {fits} |")
    lines += [
        "",
        f"terms of the config's own layout ({cfg.trainer.schedule}, {cfg.trainer.num_workers} trainer ranks):",
    ]
    lines += describe(plan_memory(cfg, shape, device_bytes))
    return "\n".join(lines)


def describe(plan: MemoryPlan) -> list[str]:
    """Every term of ``plan`` with its GB and where it comes from."""
    t, r = plan.trainer, plan.rollout
    roles: list[tuple[str, Terms]] = [
        (f"trainer rank ({t.strategy}, {t.ranks} ranks, {t.tokens} tokens a micro-batch)", t)
    ]
    if r is not None:
        budget = f", vLLM budget {_gb(r.budget)} GB" if r.engine == "vllm" else ""
        roles.append((f"rollout rank ({r.engine}{budget})", r))
    out = []
    for head, m in roles:
        out += [f"{head}: {_gb(m.total)} GB", *[f"  {name:13} {_gb(b):>7} GB  {doc}" for name, b, doc in m.terms()]]
    return out
