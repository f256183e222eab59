"""Rollout skip (``rollout.skip``; docs/rollout_trace.md): dump each step's generated batch under a key of every
config field that decides what is generated (``key.json``), and let a later run with the same key reuse it instead of
generating. A run whose key differs is stopped with an error naming the fields, never fed another run's samples.

``cache`` checks a dump's prompts against the ones this run drew for the step; ``repeat`` reuses the latest dump
before a step that has none, unchecked. Reused samples keep the weight versions they were generated with, so
staleness is reported as it really is. With dynamic sampling a step's later generation batches are dumped as
``step_N_genG.pkl``, which ``repeat`` cannot use; neither can ``fully_async``, which streams groups (both config
errors).
"""

from __future__ import annotations

import functools
import json
import pickle
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

from asyncrl.checkpoint import atomic_write_bytes
from asyncrl.config import Config
from asyncrl.errors import UserInputError
from asyncrl.run.generation import Generated, Launched, Replayed
from asyncrl.types import Prompt


class RolloutSkipError(UserInputError, RuntimeError):
    """The dump directory belongs to another generation setup, or its dump does not fit this run."""


GENERATION_FIELDS = (  # the config fields that decide which samples a step generates, in key.json's order
    "model.path model.lora_rank data.train_files data.train_batch_size data.max_prompt_length data.shuffle "
    "rollout.engine rollout.quantization rollout.n rollout.temperature rollout.top_p rollout.top_k "
    "rollout.response_length rollout.num_workers trainer.schedule trainer.seed trainer.num_workers"
).split()


def generation_key(cfg: Config) -> dict[str, object]:
    """The ``GENERATION_FIELDS``' values, as ``key.json`` holds them (JSON: paths as text, tuples as lists)."""
    key = {name: functools.reduce(getattr, name.split("."), cfg) for name in GENERATION_FIELDS}
    d, fg = cfg.data, cfg.algorithm.filter_groups
    # dynamic sampling decides which prompts each later step draws: named only when on, so a dump directory written
    # before these keys existed still matches a run without them
    if fg.enable:
        key.update({"algorithm.filter_groups.metric": fg.metric, "data.gen_batch_size": d.prompts_per_generation})
    return json.loads(json.dumps(key, default=str))


class _Dumping(Launched):
    """A batch being generated, dumped when it is waited for; everything else as ``launched`` (its pool, which
    replaces a worker that dies mid-generation, included)."""

    def __init__(self, launched: Launched, path: Path):
        super().__init__(**{f.name: getattr(launched, f.name) for f in fields(Launched)})
        self.path = path

    def result(self) -> Generated:
        gen = super().result()
        atomic_write_bytes(self.path, pickle.dumps(gen.samples))  # a crash mid-write never leaves a torn dump
        return gen


class RolloutSkip:
    """A run's ``rollout.skip`` (built only when it is enabled): its dump directory, claimed for this run's
    generation key."""

    def __init__(self, cfg: Config):
        self.action, self.dir = cfg.rollout.skip.action, Path(cfg.rollout.skip.dump_dir)
        key, path = generation_key(cfg), self.dir / "key.json"
        self.dir.mkdir(parents=True, exist_ok=True)
        if path.exists():
            theirs = json.loads(path.read_text())
            differ = sorted(k for k in set(key) | set(theirs) if key.get(k) != theirs.get(k))
            if differ:
                shown = ", ".join(f"{k} (dumped {theirs.get(k)!r}, this run {key.get(k)!r})" for k in differ[:4])
                raise RolloutSkipError(
                    f"rollout.skip.dump_dir {self.dir}: dumped by a different generation setup: {shown}; "
                    "use another dump_dir or the same settings"
                )
        else:
            path.write_text(json.dumps(key, indent=1) + "\n")

    def _dump(self, step: int, gen_batch: int = 1) -> Path:
        """A step's first generation batch's dump; with dynamic sampling, its later ones beside it."""
        return self.dir / (f"step_{step}.pkl" if gen_batch == 1 else f"step_{step}_gen{gen_batch}.pkl")

    def launch(
        self, prompts: list[Prompt], step: int, generate: Callable[[], Launched], gen_batch: int = 1
    ) -> Launched | Replayed:
        """Step ``step``'s batch of ``prompts`` (its ``gen_batch``-th generation batch with dynamic sampling):
        ``generate``-d (and dumped), or read back from the dump. ``repeat`` never meets a ``gen_batch`` > 1 (a config
        error)."""
        path = self._dump(step, gen_batch)
        if path.exists():
            samples = pickle.loads(path.read_bytes())
            drawn = sorted(p.index for p in prompts)
            dumped = sorted({s.prompt.index for s in samples})
            if drawn != dumped:
                raise RolloutSkipError(
                    f"rollout.skip: {path} holds prompts {dumped[:5]}... but this run drew {drawn[:5]}... for step "
                    f"{step} (the data, its order or the rewards that dynamic sampling filters on changed since the "
                    "dump)"
                )
            return Replayed(samples)
        if self.action == "repeat":
            earlier = [s for s in range(step - 1, 0, -1) if self._dump(s).exists()]
            if earlier:
                return Replayed(pickle.loads(self._dump(earlier[0]).read_bytes()))
        return _Dumping(generate(), path)
