"""``asyncrl preflight``: the run's command line, checked part by part on the cluster it will use, in minutes and
before any long load, instead of at step 1 after loading the model.

One PASS or FAIL line a part, in order: memory plan (a plan that cannot fit stops here, before any worker starts),
placement, trainer group, weight sync, fingerprint, decode, trainer micro-batch; what each runs and when it fails:
docs/gpu.md, "Before a run: asyncrl preflight". The exit status is 0 only when every line passes. Worker logs go to
``trainer.default_local_dir``/preflight/logs, so the run's own directory is left untouched.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path

from asyncrl.config import Config
from asyncrl.errors import one_line
from asyncrl.preflight.checks import Check, failures, skipped

PREFLIGHT_DIR = "preflight"


def preflight_config(cfg: Config) -> Config:
    """``cfg`` with its worker logs under ``trainer.default_local_dir``/preflight."""
    out = copy.deepcopy(cfg)
    out.trainer.default_local_dir = str(Path(cfg.trainer.default_local_dir) / PREFLIGHT_DIR)
    return out


def run_preflight(cfg: Config, emit: Callable[[str], None] = print, _corrupt_bucket: int | None = None) -> list[Check]:
    """Check ``cfg``'s run (the module docstring's lines, each handed to ``emit`` as it is decided) and return
    them. A config the algorithm refuses raises its ``ConfigError`` as ``asyncrl train`` would. ``_corrupt_bucket``:
    the weight sync's test hook (a byte of that bucket flipped after its checksum is taken)."""
    from asyncrl.algorithms import algorithm_class, check_config
    from asyncrl.config.specs import role_specs
    from asyncrl.models.loading import check_model_dir
    from asyncrl.models.loading import load_tokenizer_from as load_tokenizer
    from asyncrl.preflight import checks
    from asyncrl.run.generation import PromptStream
    from asyncrl.schedules import schedule_module
    from asyncrl.workers.start import start_roles

    t0 = time.perf_counter()
    check_config(cfg)
    cfg = preflight_config(cfg)
    lines: list[Check] = []

    def add(*new: Check) -> None:
        for c in new:
            lines.append(c)
            emit(c.line())

    mem, plan = checks.memory_plan(cfg)
    add(mem)
    if not mem.ok:
        add(skipped("roles", "the memory plan does not fit (nothing was loaded)"))
        return _end(lines, t0, emit)
    module = schedule_module(cfg)
    side, producer = module.rollout_side()
    cls = algorithm_class(cfg)
    specs = role_specs(cfg, cls.trainer_needs(cfg), module.trainer_plan(cfg))
    check_model_dir(cfg.model.path)
    tokenizer = load_tokenizer(cfg.model.path)
    prompt = PromptStream(cfg, tokenizer).train[0]  # the training data's first, tokenised as the run will
    started = time.perf_counter()
    try:
        with (
            cls.resources(cfg, tokenizer, cfg.trainer.default_local_dir) as resources,
            start_roles(cfg, side, specs, cls.roles_needed(cfg), producer) as roles,
        ):
            ready = cfg.trainer.role_start_timeout_s
            add(*checks.placement(roles, ready))
            emit(f"      (roles started in {time.perf_counter() - started:.1f} s)")
            group = checks.trainer_group(roles, cfg.weight_sync.timeout_s)
            add(group)
            add(*checks.weight_sync(cfg, roles, _corrupt_bucket))
            add(*checks.decode(cfg, roles, prompt))
            if group.ok:
                algorithm = cls(cfg, tokenizer, roles, resources)
                add(checks.micro_batch(cfg, algorithm, plan, len(tokenizer)))
            else:
                add(skipped("trainer micro-batch", "the trainer group failed (an update needs every rank)"))
    except Exception as e:  # noqa: BLE001 - a role that cannot start (placement, a model, a rendezvous) is a finding
        add(Check("roles", False, f"did not start: {one_line(e)}"))
    return _end(lines, t0, emit)


def _end(lines: list[Check], t0: float, emit: Callable[[str], None]) -> list[Check]:
    bad = failures(lines)
    verdict = "all passed" if not bad else f"{len(bad)} failed ({', '.join(c.part for c in bad)})"
    emit(f"preflight: {len(lines) - len(bad)} of {len(lines)} passed, {verdict}, in {time.perf_counter() - t0:.1f} s")
    return lines


def passed(lines: list[Check]) -> bool:
    return bool(lines) and not failures(lines)
