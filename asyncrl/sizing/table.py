"""The memory plan as ``asyncrl plan --model`` prints it: one row per layout shown (each role's GB per GPU, marked
where it does not fit), then every term of the layout the config itself asks for."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from asyncrl.config import Config
from asyncrl.sizing.memory import GB, MemoryPlan, plan_memory
from asyncrl.sizing.shape import ModelShape


@dataclass(frozen=True)
class Layout:
    """A schedule on ``trainer`` trainer GPUs and ``rollout`` rollout GPUs (0 for sync: generation on the trainer's)."""

    schedule: str
    trainer: int
    rollout: int = 0
    name: str = ""  # how the table names it (the time model's rank and knobs); default: schedule and GPUs

    def label(self) -> str:
        if self.name:
            return self.name
        if self.schedule == "sync":
            return f"sync ({self.trainer})"
        return f"{self.schedule} ({self.rollout} gen / {self.trainer} train)"


def _gb(x: int) -> str:
    return f"{x / GB:.1f}"


def format_memory(cfg: Config, shape: ModelShape, layouts: list[Layout], device_bytes: int | None) -> str:
    d = f"{device_bytes / GB:.0f} GB" if device_bytes is not None else "unknown size"
    lines = [
        f"memory per GPU: {cfg.model.path} ({shape.params / 1e9:.2f}B parameters), trainer.strategy="
        f"{cfg.trainer.strategy}, model.dtype={cfg.model.dtype}, rollout.engine={cfg.rollout.engine}; GPUs of {d}",
        "",
        "| layout | trainer GB/GPU | rollout GB/GPU | rollout KV GB | fits |",
        "| --- | --- | --- | --- | --- |",
    ]
    for lay in layouts:
        c = copy.deepcopy(cfg)  # cfg's plan with its schedule and trainer ranks replaced by the layout's
        c.trainer.schedule = lay.schedule
        p = plan_memory(c, shape, device_bytes, trainer_ranks=lay.trainer)
        r = p.rollout
        problems = p.problems()
        fits = "yes" if not problems else "NO: " + "; ".join(problems)
        rollout = "-" if r is None else _gb(r.total)
        kv = "-" if r is None else _gb(r.kv_cache)
        lines.append(f"| {lay.label()} | {_gb(p.trainer.total)} | {rollout} | {kv} | {fits} |")
    lines += [
        "",
        f"terms of the config's own layout ({cfg.trainer.schedule}, {cfg.trainer.num_workers} trainer ranks):",
    ]
    lines += describe(plan_memory(cfg, shape, device_bytes))
    return "\n".join(lines)


def describe(plan: MemoryPlan) -> list[str]:
    """Every term of ``plan`` with its GB and where it comes from."""
    t = plan.trainer
    out = [
        f"trainer rank ({t.strategy}, {t.ranks} ranks, {t.tokens} tokens a micro-batch): {_gb(t.total)} GB",
        *[f"  {name:13} {_gb(b):>7} GB  {doc}" for name, b, doc in t.terms()],
    ]
    r = plan.rollout
    if r is not None:
        budget = f", vLLM budget {_gb(r.budget)} GB" if r.engine == "vllm" else ""
        out += [
            f"rollout rank ({r.engine}{budget}): {_gb(r.total)} GB",
            *[f"  {name:13} {_gb(b):>7} GB  {doc}" for name, b, doc in r.terms()],
        ]
    return out
