"""``CostModel``: what one finished run's work costs, per unit, with each term's fit error (``cost.json``).

A term is linear in what the run did: ``seconds = sum(coef_k * x_k)`` over named regressors, fitted by least squares
with non-negative coefficients over the run's measured steps. The decode term follows the run's engine
(``decode_segments``, ``prefill_tokens``; docs/performance.md). A run whose prompts are all alike in length cannot tell
prefill from the call's fixed cost: without a probe a prefilled token is priced as a decoded position.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from asyncrl.errors import UserInputError
from asyncrl.planning.slots import SimRank, SimRow

COST_VERSION = 1


class CostModelError(UserInputError, ValueError):
    """A cost.json that is missing, not JSON, or lacks a field (names the file and the field)."""


@dataclass(frozen=True)
class Term:
    """``seconds = sum(coef[k] * x[k])``; ``rel_err``: relative RMS error over the ``n`` observations it was fitted
    on (0 for a term taken from elsewhere, ``n=0``)."""

    names: tuple[str, ...]
    coef: tuple[float, ...]
    rel_err: float = 0.0
    n: int = 0

    def __call__(self, **x: float) -> float:
        if unknown := set(x) - set(self.names):
            raise KeyError(f"Term{self.names}: no regressor {sorted(unknown)}")
        return sum(c * x.get(k, 0.0) for k, c in zip(self.names, self.coef))

    def get(self, name: str) -> float:
        return self.coef[self.names.index(name)]

    def describe(self) -> str:
        parts = ", ".join(f"{k} {c:.3g}" for k, c in zip(self.names, self.coef))
        err = f"fit error {100 * self.rel_err:.1f}% over {self.n} steps" if self.n else "not fitted"
        return f"{parts} ({err})"


def _nonneg_lstsq(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: a regressor whose free coefficient comes out negative is dropped
    and the rest refitted (a cost is never negative)."""
    keep = [j for j in range(X.shape[1]) if np.any(X[:, j] != 0)]
    coef = np.zeros(X.shape[1])
    while keep:
        sol, *_ = np.linalg.lstsq(X[:, keep], Y, rcond=None)
        if np.all(sol >= 0):
            coef[keep] = sol
            break
        keep = [k for k, c in zip(keep, sol) if c > min(sol)]  # drop the most negative one
    return coef


def fit_term(names: tuple[str, ...], rows: list[list[float]], y: list[float]) -> Term:
    """``_nonneg_lstsq``, robust to a few disturbed observations (a step slowed by another job on the machine): an
    observation more than 3x the median relative residual off (and over 15%) is left out and the fit redone, once.
    ``rel_err`` is the relative RMS error over every observation, the ones left out included."""
    if not y:
        raise ValueError(f"fit_term{names}: no observations")
    X, Y = np.asarray(rows, dtype=float), np.asarray(y, dtype=float)
    coef = _nonneg_lstsq(X, Y)
    rel = (X @ coef - Y) / np.maximum(np.abs(Y), 1e-9)
    inliers = np.abs(rel) <= max(0.15, 3.0 * float(np.median(np.abs(rel))))
    if 2 <= inliers.sum() < len(Y):
        coef = _nonneg_lstsq(X[inliers], Y[inliers])
        rel = (X @ coef - Y) / np.maximum(np.abs(Y), 1e-9)
    return Term(names, tuple(float(c) for c in coef), float(np.sqrt(np.mean(rel**2))), len(y))


@dataclass(frozen=True)
class Segment:
    """``tokens`` decode steps of one call, each costing ``step + token x live`` (``live`` rows in the batch);
    ``finished`` rows end within it."""

    tokens: int
    live: int
    finished: int


ENGINES = ("builtin", "vllm")


def segments_term(segments: Sequence[tuple[int, int, float]]) -> Term:
    """A decode step's (step, token) price: its fixed part and its part per row in the batch, fitted on the
    built-in engine's measured stretches of a constant batch (rows in the batch, steps, seconds;
    ``DecodeResult.segments``)."""
    return fit_term(("step", "token"), [[n, n * live] for live, n, _ in segments], [sec for *_, sec in segments])


def decode_segments(remaining: list[int], engine: str = "builtin", slots: int = 0) -> list[Segment]:
    """The decode steps of one call over rows needing ``remaining`` tokens each (in the call's order), as segments of
    a constant batch. ``builtin``: the engine's slots (``rollout.continuous``): rows take the lowest free slot of
    ``slots`` (0: one each); a step runs every slot in use (``live``); then ended rows free theirs, trailing free
    slots go, and the live rows are packed once live + waiting rows are at most half the slots in use. ``vllm``: at
    most ``slots`` rows run (0: all); a finished row leaves at once and the next waiting row takes its place."""
    if engine == "vllm":
        return continuous_schedule([r for r in remaining if r > 0], slots)[0]
    rank = SimRank(slots or len(remaining), waiting=[SimRow(None, r) for r in remaining if r > 0])  # type: ignore[arg-type]
    segs: list[Segment] = []
    rank.fill()
    while rank.live:
        start, live = rank.t, len(rank.used)
        done = rank.step_to(rank.live[0][0])
        seg = Segment(rank.t - start, live, len(done))
        if segs and segs[-1].live == seg.live:  # one constant batch across the end of rows that left no slot behind
            last = segs.pop()
            seg = Segment(last.tokens + seg.tokens, seg.live, last.finished + seg.finished)
        segs.append(seg)
    return segs


def continuous_schedule(rem: list[int], slots: int) -> tuple[list[Segment], list[int]]:
    """Continuous batching of rows needing ``rem`` tokens, at most ``slots`` at once (0: all): rows start in order as
    slots free (a row needing 0 frees its slot at once), each segment ends where a running row finishes. Returns
    the segments and the step each row starts at."""
    slots = slots if 0 < slots < len(rem) else len(rem)
    starts = [0] * len(rem)
    running = sorted(rem[:slots])  # the step each running row finishes at
    nxt = slots  # the next waiting row
    segs: list[Segment] = []
    t = 0
    while running:
        end = running[0]
        fin = sum(1 for e in running if e == end)
        if end > t:
            segs.append(Segment(end - t, len(running), fin))
        t = end
        running = running[fin:]
        for _ in range(min(fin, len(rem) - nxt)):  # the freed slots take the next waiting rows
            starts[nxt] = t
            bisect.insort(running, t + rem[nxt])
            nxt += 1
    return segs, starts


def prefill_tokens(prefixes: Iterable[tuple[Hashable | None, int]], engine: str) -> int:
    """Prompt tokens one engine call prefills, from each row's (prefix key, prefix length): the built-in engine
    prefills the rows of one key (a group's shared prompt) once and a row keyed None alone; vLLM prefills every
    request (its prefix cache shares nothing between requests scheduled together)."""
    seen: set[Hashable] = set()
    total = 0
    for key, n in prefixes:
        if key is not None and engine != "vllm":
            if key in seen:
                continue
            seen.add(key)
        total += n
    return total


def decode_regressors(
    remaining: list[int], prefill_tokens: float, engine: str = "builtin", slots: int = 0
) -> dict[str, float]:
    """The decode term's regressors for one call: (call, step, token, prefill_token): the call, its decode steps,
    the positions its steps ran (live rows per step) and the prompt tokens it prefilled."""
    segs = decode_segments(remaining, engine, slots)
    return {
        "call": 1.0 if remaining else 0.0,
        "step": float(sum(s.tokens for s in segs)),
        "token": float(sum(s.tokens * s.live for s in segs)),
        "prefill_token": float(prefill_tokens),
    }


def update_positions(groups: Iterable[tuple[int, Sequence[int]]], shared_prefix: bool) -> int:
    """Positions an update runs for these (prompt length, response lengths) groups, padding and skipped rows aside:
    the prompt once per group with ``actor.shared_prefix`` where sharing pays (``asyncrl.data.packing.sharing_pays``,
    the rule the packing follows), once per response otherwise."""
    from asyncrl.data.packing import sharing_pays

    return sum((p if shared_prefix and sharing_pays(p, list(rs)) else p * len(rs)) + sum(rs) for p, rs in groups)


@dataclass(frozen=True)
class Scaling:
    """How this device's throughput changes with threads, and what a weight sync costs on it (``asyncrl probe``, or the
    defaults: perfect scaling, no probe). ``*_serial``: Amdahl's serial fraction of each phase, from its seconds at
    1 and ``threads`` threads; ``sync_*``: seconds of one weight sync = fixed + bytes / bytes_per_s."""

    gen_serial: float = 0.0
    train_serial: float = 0.0
    sync_fixed_s: float = 0.0
    sync_bytes_per_s: float = 1e9
    measured: bool = False
    notes: str = ""
    prefill_token_s: float | None = None  # seconds per prefilled token on the run's threads (None: not probed)
    # the built-in engine streaming (fully_async's Rollouter), on the run's threads, in the probe's process (None:
    # not probed; the batch decode's prices): a step = fixed + per row in a slot; taking rows in = fixed + per
    # prefilled token (the prefill) + per row taken in (its cache written into a slot, the slots' cache moved)
    stream_step_s: float | None = None
    stream_row_s: float | None = None
    stream_admit_s: float | None = None
    stream_admit_token_s: float | None = None
    stream_admit_row_s: float = 0.0
    stream_serial: float | None = None  # Amdahl's serial fraction of a streamed step (None: generation's)
    stream_admit_serial: float | None = None  # ... of taking rows in (None: a streamed step's)
    # a run of several pools on the CPU (docs/performance.md, "Two jobs on one CPU's cores"): the update's speed alone
    # over its priced one, and two jobs' speeds together over alone (None: not probed; a fair share of the cores)
    shared_train: float | None = None
    oversubscribed_parallel: float | None = None
    oversubscribed_single: float | None = None
    # a fully_async weight push beyond its park, timed on the run's own roles (the probe's push: the calls around the
    # transfer, the transfer and the load as the run makes them; None: not probed, priced as a plain sync)
    stream_push_s: float | None = None

    def speed(self, phase: str, threads: float) -> float:
        """Throughput on ``threads`` cores (fractional: time-sliced) relative to one core; ``phase``: gen, train,
        stream (a streamed step) or admit (a streaming engine taking rows in)."""
        if phase == "admit" and self.stream_admit_serial is not None:
            s = self.stream_admit_serial
        elif phase in ("stream", "admit") and self.stream_serial is not None:
            s = self.stream_serial
        else:
            s = self.gen_serial if phase in ("gen", "stream", "admit") else self.train_serial
        if threads <= 1.0:
            return max(threads, 1e-9)
        return 1.0 / (s + (1.0 - s) / threads)


@dataclass(frozen=True)
class CostModel:
    """One run's work and what each unit of it cost on the device it ran on."""

    source: str
    schedule: str
    # the work, per step
    prompts_per_step: int
    n: int
    max_batch_size: int
    max_new_tokens: int
    ppo_mini_batch_size: int
    # every trained group's (prompt length, its responses' lengths), in the run's data order: the distribution with
    # its tail, and the lengths within a group kept together (a hard prompt's rows are all long)
    groups: tuple[tuple[int, tuple[int, ...]], ...]
    # positions the update processed per position of the samples, over the measured steps together: skipped
    # zero-advantage rows lower it, padding raises it (above 1 where the update skips nothing)
    update_keep: float
    shared_prefix: bool
    # the device it ran on
    device: str  # "cpu" or "cuda"
    cores: int  # the machine's cores (cpu) or devices (cuda) the run had
    gen_threads: int  # threads (cpu) or devices (cuda) the profiled generation ran on
    train_threads: int
    weight_bytes: int
    # the fitted terms, in seconds
    decode: Term  # one engine decode call (one chunk of max_batch_size rows): (call, step, token, prefill_token)
    update: Term  # update_actor: (call, token)
    train_other: Term  # the rest of timing_s/train (log-probs, the driver's round trip): (call, token)
    prepare: Term  # advantages, critic values, a teacher's knowledge: (call, token) over the batch's positions
    reward: Term  # scoring: (row,)
    step_other: Term  # the step's remainder outside gen/prepare/train (metrics, logging): (call,)
    scaling: Scaling = field(default_factory=Scaling)
    engine: str = "builtin"  # rollout.engine: how a decode call batches its rows (decode_segments)
    max_num_seqs: int = 0  # vllm: rows scheduled at once (0: every row of the call)
    version: int = COST_VERSION

    def prepare_s(self, positions: float) -> float:
        """Seconds to prepare a batch of ``positions`` prompt + response tokens (a profile written before the
        token regressor existed prices the call alone)."""
        x = {"call": 1.0, "token": float(positions)}
        return self.prepare(**{k: v for k, v in x.items() if k in self.prepare.names})

    @property
    def chunk_rows(self) -> int | None:
        """Rows one engine call takes at once: the built-in engine's ``max_batch_size``; vLLM takes them all."""
        return None if self.engine == "vllm" else self.max_batch_size

    @property
    def response_lengths(self) -> list[int]:
        return [r for _, rs in self.groups for r in rs]

    def describe(self) -> list[str]:
        lens = np.asarray(self.response_lengths)
        lines = [
            f"work: {self.prompts_per_step} prompts x {self.n} per step; response length mean {lens.mean():.1f}, "
            f"p50 {np.percentile(lens, 50):.0f}, p95 {np.percentile(lens, 95):.0f}, max {lens.max()} "
            f"(of {self.max_new_tokens}); the update processes {self.update_keep:.2f} positions per sample position",
            f"engine: {self.engine}" + (f" (max_num_seqs {self.max_num_seqs})" if self.engine == "vllm" else ""),
            f"device: {self.device}, {self.cores} cores/devices; generation on {self.gen_threads}, "
            f"training on {self.train_threads}; weights {self.weight_bytes / 1e6:.1f} MB",
            f"decode s/call = {self.decode.describe()}",
            f"update s = {self.update.describe()}",
            f"other train s = {self.train_other.describe()}",
            f"prepare s (advantages; a teacher's knowledge) = {self.prepare.describe()}",
            f"reward s = {self.reward.describe()}",
            f"step overhead s = {self.step_other.describe()}",
        ]
        sc = self.scaling
        if sc.measured:
            lines.append(
                f"device probe: serial fraction gen {sc.gen_serial:.2f}, train {sc.train_serial:.2f}; weight sync "
                f"{sc.sync_fixed_s * 1e3:.1f} ms + {sc.sync_bytes_per_s / 1e9:.2f} GB/s ({sc.notes})"
            )
        else:
            lines.append("device probe: none (perfect thread scaling assumed; asyncrl probe measures it)")
        return lines

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")

    @staticmethod
    def load(path: str | Path) -> CostModel:
        p = Path(path)
        if not p.is_file():
            raise CostModelError(f"cost model {p}: no such file (asyncrl profile RUN_DIR writes RUN_DIR/cost.json)")
        try:
            raw = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise CostModelError(f"cost model {p}: not JSON ({e})") from None
        return from_dict(raw, str(p))


def _term(raw: Any, where: str) -> Term:
    if not isinstance(raw, dict) or not {"names", "coef"} <= set(raw):
        raise CostModelError(f"{where}: a term needs 'names' and 'coef', got {raw!r:.80}")
    try:
        names, coef = tuple(str(n) for n in raw["names"]), tuple(float(c) for c in raw["coef"])
        term = Term(names, coef, float(raw.get("rel_err", 0.0)), int(raw.get("n", 0)))
    except (TypeError, ValueError):
        raise CostModelError(f"{where}: names must be a list of strings, coef, rel_err and n numbers") from None
    if len(names) != len(coef):
        raise CostModelError(f"{where}: {len(names)} names but {len(coef)} coefficients")
    return term


def from_dict(raw: Any, where: str) -> CostModel:
    where = f"cost model {where}"
    if not isinstance(raw, dict):
        raise CostModelError(f"{where}: expected a JSON object")
    if raw.get("version") != COST_VERSION:
        raise CostModelError(f"{where}: version {raw.get('version')!r}, this asyncrl reads {COST_VERSION}")
    kw: dict[str, Any] = {}
    for f in fields(CostModel):
        if f.name not in raw:
            if f.name in ("scaling", "version", "engine", "max_num_seqs"):  # optional: their defaults
                continue
            raise CostModelError(f"{where}: missing field {f.name!r}")
        v = raw[f.name]
        if f.name in ("decode", "update", "train_other", "prepare", "reward", "step_other"):
            v = _term(v, f"{where}: {f.name}")
        elif f.name == "scaling":
            known = {g.name for g in fields(Scaling)}
            if not isinstance(v, dict):
                raise CostModelError(f"{where}: scaling must be a JSON object, got {v!r:.80}")
            v = {k: x for k, x in v.items() if k != "shared_gen"}  # a one-thread decode policy factor: not a price
            if set(v) - known:
                raise CostModelError(f"{where}: scaling has unknown keys {sorted(set(v) - known)}")
            v = Scaling(**v)
        elif f.name == "groups":
            try:
                v = tuple((int(p), tuple(int(r) for r in rs)) for p, rs in v)
            except (TypeError, ValueError):
                raise CostModelError(f"{where}: groups must be [[prompt_len, [response_len, ...]], ...]") from None
            if not v:
                raise CostModelError(f"{where}: groups is empty")
        kw[f.name] = v
    model = CostModel(**kw)
    for name in ("prompts_per_step", "n", "max_batch_size", "max_new_tokens", "cores", "gen_threads"):
        value = getattr(model, name)
        if not isinstance(value, int) or value < 1:
            raise CostModelError(f"{where}: {name} must be a positive integer, got {value!r}")
    if model.engine not in ENGINES:
        raise CostModelError(f"{where}: engine {model.engine!r} is not one of {', '.join(ENGINES)}")
    if not isinstance(model.update_keep, int | float) or not (0.0 < model.update_keep < math.inf):
        raise CostModelError(f"{where}: update_keep must be a positive number, got {model.update_keep!r}")
    return model
