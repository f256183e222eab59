"""A decode call on the virtual clock, priced by the engine's own structure (``cost.decode_segments``): one step per
token; each step costs a fixed part plus a part per live row; rows split by group over the rollout replicas, which
step together. The built-in engine runs them in chunks of ``max_batch_size`` rows, each chunk to its longest row;
vLLM takes every row in one call, ``max_num_seqs`` at a time, a finished row's slot taken by the next at once. A
pause (partial rollout) or a refill cut stops it between pieces; the rows keep what they have and continue,
re-prefilled, in a later call.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from itertools import accumulate
from typing import TypeVar

from asyncrl.planning.clock import Compute
from asyncrl.planning.cost import continuous_schedule, decode_segments, prefill_tokens
from asyncrl.planning.setting import Prices
from asyncrl.types import engine_chunks

T = TypeVar("T")
PIECES = 16  # a decode call is cut into at most this many pieces per segment: a pause lands within 1/16 of it


# ---- decode on the clock ---------------------------------------------------------------------------------------------
@dataclass
class Row:
    need: int  # tokens still to generate
    prefix: int  # tokens to prefill before it continues
    shared: int  # a blank row's group id (rows of one blank group share one prefill); -1 when resumed


@dataclass
class Decoded:
    tokens: list[int]  # tokens each row generated in this call
    finished: list[bool]


def decode(
    prices: Prices,
    rows: list[Row],
    stop: Callable[[], bool] = lambda: False,
    refill: Callable[[int, int], bool] | None = None,
):
    """A process fragment (``yield from``): one engine call over ``rows`` split over the replicas, in the engine's
    calls per replica (``CostModel.chunk_rows``). ``stop()`` (a pause) and ``refill(n_active, n_rows)`` are checked
    between pieces; both cut the call there. Returns ``Decoded``."""
    cost = prices.cost
    got = [0] * len(rows)
    # the Rollouter's own split: a blank group's rows stay together, a resumed row is a group of its own
    shares = split_by_group(rows, prices.replicas, key=lambda r: r.shared if r.shared >= 0 else id(r))
    size = cost.chunk_rows or max(1, len(rows))
    # every replica's chunks run one after another; the replicas step together
    plans = [[[share[i] for i in c] for c in engine_chunks([rows[i].prefix for i in share], size)] for share in shares]
    n_calls = max((len(chunks) for chunks in plans), default=0)
    cut = False
    for c in range(n_calls):
        chunk_rows = [chunks[c] if c < len(chunks) else [] for chunks in plans]
        # a blank group's rows share their group's prefix key (one prefill); a resumed row has none
        keyed = [[(rows[i].shared if rows[i].shared >= 0 else None, rows[i].prefix) for i in ch] for ch in chunk_rows]
        prefill = max(prefill_tokens(k, cost.engine) for k in keyed)
        yield Compute(prices.call_s(prefill), prices.gen_threads, prices.pool)
        per_rep, start = [], {}  # each replica's segments; the step each row starts at (vLLM: as slots free)
        for ch in chunk_rows:
            if cost.engine == "vllm":
                segs, starts = continuous_schedule([rows[i].need for i in ch], cost.max_num_seqs)
                start.update(zip(ch, starts))
            else:
                segs = decode_segments([rows[i].need for i in ch])
            per_rep.append(segs)
        # the union of every replica's segment boundaries: between two, each replica's live batch is constant
        ends = [list(accumulate(s.tokens for s in segs)) for segs in per_rep]
        bounds = sorted({0} | {b for e in ends for b in e})
        n0 = len(chunk_rows[0])
        # where a pause or a refill may cut: within every segment (the built-in engine's few), or at every k-th of
        # vLLM's boundaries (one per finished row) when there are more than 4 x PIECES
        every = 1 if cost.engine != "vllm" else max(1, (len(bounds) - 1) // (4 * PIECES))
        ptr = [0] * len(per_rep)  # each replica's segment at the current step
        fin0 = 0  # rows of replica 0's chunk finished so far
        pending = 0.0  # priced steps not yet yielded
        for k, (a, b) in enumerate(zip(bounds, bounds[1:]), 1):
            here = []
            for r, segs in enumerate(per_rep):
                while ptr[r] < len(segs) and ends[r][ptr[r]] <= a:
                    if r == 0:
                        fin0 += segs[ptr[r]].finished
                    ptr[r] += 1
                if ptr[r] < len(segs):
                    here.append(segs[ptr[r]])
            piece = max(1, (b - a) // PIECES) if every == 1 else b - a
            t = a
            while t < b:
                u = min(b, t + piece)
                pending += max((prices.segments_cost(seg, u - t) for seg in here), default=0.0)
                t = u
                if t < b or k % every == 0 or k == len(bounds) - 1:
                    yield Compute(pending, prices.gen_threads, prices.pool)
                    pending = 0.0
                if t < b and stop():
                    cut = True
                    break
            if cut:
                break
            if k % every:
                continue
            done0 = fin0 + sum(s.finished for s, e in zip(per_rep[0][ptr[0] :], ends[0][ptr[0] :]) if e <= t)
            if stop() or (refill is not None and n0 > done0 and refill(n0 - done0, n0)):
                cut = any(_done(rows, start, i, t) < rows[i].need for ch in chunk_rows for i in ch)
                if cut:
                    break
        for ch in chunk_rows:
            for i in ch:
                got[i] = _done(rows, start, i, t if cut else bounds[-1])
        if cut:
            break
    finished = [got[i] >= rows[i].need for i in range(len(rows))]
    return Decoded(got, finished)


def _done(rows: list[Row], start: dict[int, int], i: int, t: int) -> int:
    """Tokens row ``i`` has after ``t`` steps of its call (it starts at ``start[i]``, 0 when absent)."""
    return min(rows[i].need, max(0, t - start.get(i, 0)))


def split_by_group(
    rows: list[T], shares: int, key: Callable[[T], Hashable] = lambda s: s.prompt.uid
) -> list[list[int]]:
    """Row indices for ``shares`` ranks: whole groups (rows of one ``key``, by default one prompt, stay together and
    share its prefill), cut into contiguous shares of about equal rows. Some may be empty. The simulated decode
    calls of the batch schedules split their rows over the rollout replicas with it."""
    if shares <= 1:
        return [list(range(len(rows)))]
    groups: dict[Hashable, list[int]] = {}
    for i, s in enumerate(rows):
        groups.setdefault(key(s), []).append(i)
    out: list[list[int]] = [[] for _ in range(shares)]
    target = len(rows) / shares
    k = 0
    for members in groups.values():
        if k < shares - 1 and out[k] and len(out[k]) + len(members) / 2 > target:
            k += 1
        out[k].extend(members)
    return out
