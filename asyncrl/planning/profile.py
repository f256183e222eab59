"""``asyncrl profile RUN_DIR``: fit a ``CostModel`` from a finished run's own records.

Read: ``config.yaml``, ``work.jsonl`` (each sample's lengths per step), ``metrics.jsonl`` (the driver's timings) and
``timeline.json`` (the workers' spans); fitted over the measured steps, the first (one-off costs) and any over
``DISTURBED`` times the median step left out. What each term prices, and why ``sync`` is the run to profile:
docs/performance.md, "Plan a run before renting the GPUs". What a run cannot show (``Scaling``) is measured by the
lab's ``asyncrl probe RUN_DIR``, which hands it to ``profile_run``.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from asyncrl.errors import UserInputError
from asyncrl.planning.cost import (
    CostModel,
    Scaling,
    Term,
    decode_regressors,
    fit_term,
    prefill_tokens,
    segments_term,
    update_positions,
)
from asyncrl.telemetry.timeline import read_chrome_trace
from asyncrl.telemetry.trace import WORK_FILE
from asyncrl.types import engine_chunks


class ProfileError(UserInputError, ValueError):
    """A run directory that cannot be profiled (names the file or what is missing)."""


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ProfileError(f"profile: {path} not found (profile a finished run directory of this asyncrl)")
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ProfileError(f"profile: {path} line {n} is not JSON ({e})") from None
    return out


def _weight_bytes(run: Path) -> int:
    for d in (run / "final", *sorted((run / "checkpoints").glob("*/actor"))):
        files = list(d.glob("*.safetensors")) if d.is_dir() else []
        if files:
            return sum(f.stat().st_size for f in files)
    return 0


def generation_regressors(
    rec: dict[str, Any], max_batch_size: int, shared: bool, engine: str = "builtin", slots: int = 0
) -> dict[str, float]:
    """The decode term's regressors for one step's generation, summed over the engine's calls: the built-in
    engine's chunks of ``max_batch_size`` rows (a group's prompt prefilled once with ``shared``), or vLLM's one call
    of every row, ``slots`` at a time (every request prefilled)."""
    rows = list(zip(rec["group"], rec["prompt_len"], rec["response_len"]))
    total: dict[str, float] = defaultdict(float)
    if engine == "vllm":
        chunks = [rows]
    else:
        chunks = [[rows[i] for i in c] for c in engine_chunks([p for _, p, _ in rows], max_batch_size)]
    for chunk in chunks:
        prefill = prefill_tokens(((g if shared else None, p) for g, p, _ in chunk), engine)
        for k, v in decode_regressors([r for _, _, r in chunk], prefill, engine, slots).items():
            total[k] += v
    return dict(total)


DECODE_NAMES = ("call", "step", "token", "prefill_token")
# a step over this many times the median step was slowed by something outside the run (another job on the machine):
# left out of every fit, which least squares would follow however many steady steps there are
DISTURBED = 5.0
logger = logging.getLogger(__name__)


def _fit_decode(
    X: list[list[float]], y: list[float], prefill_s: float | None, segments: list[tuple[int, int, float]] = ()
) -> Term:
    """(call, step, token, prefill_token). With ``segments`` (the engine's measured decode steps: rows in the batch,
    steps, seconds), a step's fixed part and its part per row are fitted on them, where the batch size varies
    within a call (the steps of a long tail run at a fraction of the batch), and the call's part on what the steps
    leave of each generation. Without, all three on the generations alone, where the steps, positions and calls of a
    step move together and the split between them is poorly determined. A probed prefill price is taken as
    measured; without one a prefilled token is priced as a decoded position (the two fitted as one regressor)."""
    if segments:
        step_c, token_c = segments_term(segments).coef
        prefill_c = token_c if prefill_s is None else prefill_s
        left = [v - step_c * x[1] - token_c * x[2] - prefill_c * x[3] for x, v in zip(X, y)]
        call = fit_term(("call",), [[x[0]] for x in X], left)
        coef: tuple[float, ...] = (call.coef[0], step_c, token_c, prefill_c)
    elif prefill_s is not None:
        rest = fit_term(("call", "step", "token"), [x[:3] for x in X], [v - prefill_s * x[3] for x, v in zip(X, y)])
        coef = (*rest.coef, prefill_s)
    else:
        rest = fit_term(("call", "step", "token"), [[x[0], x[1], x[2] + x[3]] for x in X], y)
        coef = (*rest.coef, rest.coef[2])
    pred = [sum(c * v for c, v in zip(coef, x)) for x in X]
    rel = statistics.fmean(((p - v) / max(abs(v), 1e-9)) ** 2 for p, v in zip(pred, y)) ** 0.5
    return Term(DECODE_NAMES, coef, rel, len(y))


def step_groups(rec: dict[str, Any]) -> list[tuple[int, tuple[int, ...]]]:
    """One step's work record as (prompt length, its responses' lengths) per group, in group order."""
    per: dict[int, list[int]] = defaultdict(list)
    plen: dict[int, int] = {}
    for g, p, resp in zip(rec["group"], rec["prompt_len"], rec["response_len"]):
        per[g].append(resp)
        plen[g] = p
    return [(plen[g], tuple(rs)) for g, rs in sorted(per.items())]


def profile_run(run_dir: str | Path, probe: Callable[[CostModel, Path], Scaling] | None = None) -> CostModel:
    """The cost model of a finished run; with ``probe`` (asyncrl's lab: ``asyncrl probe``), this machine's
    ``Scaling`` measured for it too, and the decode refitted with the measured prefill price."""
    run = Path(run_dir)
    if not run.is_dir():
        raise ProfileError(f"profile: {run} is not a directory (give a finished run's directory)")
    from asyncrl.config import load_config

    cfg_path = run / "config.yaml"
    if not cfg_path.is_file():
        raise ProfileError(f"profile: {cfg_path} not found (profile a finished run directory of this asyncrl)")
    works = {r["step"]: r for r in _read_jsonl(run / WORK_FILE)}  # first: a run of an older asyncrl has none
    cfg = load_config(str(cfg_path))
    schedule = cfg.trainer.schedule
    if schedule == "fully_async":
        raise ProfileError(
            f"profile: {run} is a fully_async run; its decode calls do not line up with steps. Profile a sync, "
            "one_step_off or two_step_off run (sync is the natural one: nothing overlaps)"
        )
    metrics = [m for m in _read_jsonl(run / "metrics.jsonl") if "timing_s/step" in m and m.get("step", 0) >= 1]
    if not (run / "timeline.json").is_file():
        raise ProfileError(f"profile: {run / 'timeline.json'} not found (the run's timeline)")
    events = read_chrome_trace(run / "timeline.json")
    body = _steady([m for m in (metrics[1:] if len(metrics) > 2 else metrics) if m["step"] in works], run)
    if len(body) < 2:
        raise ProfileError(
            f"profile: {run} has {len(body)} measured steps with a work record ({WORK_FILE}); at least 2 are needed "
            f"(run 3 or more steps; runs of asyncrl before {WORK_FILE} existed cannot be profiled)"
        )
    gens: dict[int, list[float]] = defaultdict(list)
    spent: dict[tuple[str, int], float] = defaultdict(float)  # (reward or update_actor, step): seconds
    segments: dict[int, list[tuple[int, int, float]]] = {}  # a step's measured decode steps (the built-in engine)
    for e in events:
        if e.get("kind") not in ("span", "instant") or e.get("worker") == "driver":
            continue
        step = e.get("step")
        dur = e["end_s"] - e["start_s"]
        if e["name"] == "generate":
            gens[step].append(dur)
        elif e["name"] in ("reward", "update_actor"):
            spent[e["name"], step] += dur
        elif e["name"] == "decode_segments" and step is not None:
            segments.setdefault(step, [(int(a), int(b), float(c)) for a, b, c in e["args"].get("segments", [])])
    r = cfg.rollout
    shared = bool(r.enable_prefix_caching)
    X_dec, y_dec, X_up, y_up, y_oth = [], [], [], [], []
    y_rew, X_rew, prep, X_prep, other, keep = [], [], [], [], [], []
    for m in body:
        s, w = m["step"], works[m["step"]]
        if not gens.get(s):
            raise ProfileError(f"profile: step {s} has no generate span in {run / 'timeline.json'}")
        reg = generation_regressors(w, r.max_batch_size, shared, r.engine, r.max_num_seqs)
        X_dec.append([reg[k] for k in DECODE_NAMES])
        y_dec.append(gens[s][0])  # the step's own generation (a held-out evaluation may follow it)
        tokens = float(m.get("perf/actor_tokens", 0.0))
        upd = spent.get(("update_actor", s), m.get("timing_s/update_actor", 0.0))
        X_up.append([1.0, tokens])  # the update and the rest of the train call share their regressors
        y_up.append(upd)
        y_oth.append(max(0.0, m["timing_s/train"] - upd))
        X_rew.append([float(len(w["response_len"]))])
        y_rew.append(spent.get(("reward", s), 0.0))
        prep.append(m.get("timing_s/prepare", 0.0))
        gen_s = m["timing_s/gen"] if schedule == "sync" else 0.0
        other.append(max(0.0, m["timing_s/step"] - gen_s - m.get("timing_s/prepare", 0.0) - m["timing_s/train"]))
        groups = step_groups(w)
        X_prep.append([1.0, float(update_positions(groups, shared_prefix=False))])  # what a teacher scores
        full = update_positions(groups, cfg.actor.shared_prefix)
        keep.append((tokens, full))  # padding included: what the fitted per-token price was paid on
    measured = [seg for m in body for seg in segments.get(m["step"], [])]
    on_gpu = cfg.trainer.n_gpus_per_node > 0
    trainer_units = (cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node) if on_gpu else int(cfg.trainer.cpus_per_worker)
    rollout_units = (r.nnodes * r.n_gpus_per_node) if r.n_gpus_per_node > 0 else int(r.cpus_per_worker)
    gen_units = trainer_units if schedule == "sync" else rollout_units
    cost = CostModel(
        source=str(run),
        schedule=schedule,
        prompts_per_step=int(cfg.data.train_batch_size),
        n=int(r.n),
        max_batch_size=int(r.max_batch_size),
        max_new_tokens=int(r.response_length),
        ppo_mini_batch_size=int(cfg.actor.ppo_mini_batch_size),
        groups=tuple(g for step in sorted(works) for g in step_groups(works[step])),
        update_keep=_keep(keep),
        shared_prefix=bool(cfg.actor.shared_prefix),
        device="cuda" if on_gpu else "cpu",
        cores=trainer_units if on_gpu else (os.cpu_count() or 1),
        gen_threads=max(1, gen_units),
        train_threads=max(1, trainer_units),
        weight_bytes=_weight_bytes(run),
        decode=_fit_decode(X_dec, y_dec, None, measured),
        update=fit_term(("call", "token"), X_up, y_up),
        train_other=fit_term(("call", "token"), X_up, y_oth),
        prepare=fit_term(("call", "token"), X_prep, prep),
        reward=fit_term(("row",), X_rew, y_rew),
        step_other=fit_term(("call",), [[1.0]] * len(other), other),
        engine=str(r.engine),
        max_num_seqs=int(r.max_num_seqs) if r.engine == "vllm" else 0,
    )
    if probe is not None:
        scaling = probe(cost, run)
        cost = replace(cost, scaling=scaling, decode=_fit_decode(X_dec, y_dec, scaling.prefill_token_s, measured))
    return cost


def _steady(body: list[dict[str, Any]], run: Path) -> list[dict[str, Any]]:
    """The measured steps less those ``DISTURBED`` times slower than the median step (named in a warning), unless
    fewer than 2 would be left."""
    if not body:
        return body
    limit = DISTURBED * statistics.median(m["timing_s/step"] for m in body)
    steady = [m for m in body if m["timing_s/step"] <= limit]
    if len(steady) < len(body) and len(steady) >= 2:
        out = ", ".join(f"{m['step']} ({m['timing_s/step']:.2f} s)" for m in body if m["timing_s/step"] > limit)
        logger.warning("profile: %s: steps %s took over %gx the median step; left out of the fits", run, out, DISTURBED)
        return steady
    return body


def _keep(steps: list[tuple[float, int]]) -> float:
    """Positions the update processed per position of the samples, over every measured step together (a step
    whose groups all had zero advantage processed none, and counts)."""
    full = sum(f for _, f in steps)
    tokens = sum(t for t, _ in steps)
    return tokens / full if full > 0 and tokens > 0 else 1.0
