"""A decode call on the virtual clock, priced by the engine's own structure (``cost.decode_segments``): one step per
token of its longest row, each costing a fixed part plus a part per live row; rows split by group over the rollout
replicas, which step together, in chunks of ``max_batch_size`` rows. A pause (partial rollout) or a refill cut stops
it between pieces; the rows keep what they have and continue, re-prefilled, in a later call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from asyncrl.schedules.perf.clock import Clock, Compute
from asyncrl.schedules.perf.cost import Segment, decode_segments
from asyncrl.schedules.perf.setting import Prices

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
    seconds: float


def split_rows(rows: list[Row], replicas: int) -> list[list[int]]:
    """Rows by group (``shared``) into ``replicas`` contiguous shares of about equal size, as ``split_by_group``."""
    if replicas <= 1:
        return [list(range(len(rows)))]
    out: list[list[int]] = [[] for _ in range(replicas)]
    target, k, i = len(rows) / replicas, 0, 0
    while i < len(rows):
        j = i + 1
        while j < len(rows) and rows[j].shared >= 0 and rows[j].shared == rows[i].shared:
            j += 1
        if k < replicas - 1 and out[k] and len(out[k]) + (j - i) / 2 > target:
            k += 1
        out[k].extend(range(i, j))
        i = j
    return out


def decode(
    clock: Clock,
    prices: Prices,
    rows: list[Row],
    stop: Callable[[], bool] = lambda: False,
    refill: Callable[[int, int], bool] | None = None,
):
    """A process fragment (``yield from``): one engine call over ``rows`` split over the replicas, in chunks of
    ``max_batch_size`` rows per replica. ``stop()`` (a pause) and ``refill(n_active, n_rows)`` are checked between
    pieces; both cut the call there. Returns ``Decoded``."""
    t0 = clock.now
    got = [0] * len(rows)
    shares = split_rows(rows, prices.replicas)
    mbs = prices.cost.max_batch_size
    # every replica's chunks run one after another; the replicas step together
    plans = []
    for share in shares:
        chunks = [share[i : i + mbs] for i in range(0, len(share), mbs)]
        plans.append(chunks)
    n_calls = max((len(chunks) for chunks in plans), default=0)
    cut = False
    for c in range(n_calls):
        chunk_rows = [chunks[c] if c < len(chunks) else [] for chunks in plans]
        prefill = max(_prefill_tokens([rows[i] for i in ch]) for ch in chunk_rows)
        yield Compute(prices.call_s(prefill), prices.gen_threads, prices.pool, "gen")
        per_rep = [decode_segments([rows[i].need for i in ch]) for ch in chunk_rows]
        order = [sorted(ch, key=lambda i: rows[i].need) for ch in chunk_rows]
        # the union of every replica's segment boundaries: between two, each replica's live batch is constant
        bounds = sorted({0} | {b for segs in per_rep for b in _ends(segs)})
        n0 = len(chunk_rows[0])
        for a, b in zip(bounds, bounds[1:]):
            piece = max(1, (b - a) // PIECES)
            t = a
            while t < b:
                u = min(b, t + piece)
                cost = max((prices.segments_cost(_seg_at(segs, t), u - t) for segs in per_rep if _seg_at(segs, t)),
                           default=0.0)  # fmt: skip
                yield Compute(cost, prices.gen_threads, prices.pool, "gen")
                t = u
                if t < b and stop():
                    cut = True
                    break
            for ch in chunk_rows:
                for i in ch:
                    got[i] = min(rows[i].need, t)
            if cut:
                break
            active0 = sum(1 for i in order[0] if rows[i].need > t)
            if stop() or (refill is not None and active0 and refill(active0, n0)):
                cut = any(rows[i].need > t for ch in chunk_rows for i in ch)
                if cut:
                    break
        if cut:
            break
    finished = [got[i] >= rows[i].need for i in range(len(rows))]
    return Decoded(got, finished, clock.now - t0)


def _prefill_tokens(rows: list[Row]) -> float:
    seen: set[int] = set()
    total = 0
    for r in rows:
        if r.shared >= 0:
            if r.shared in seen:
                continue
            seen.add(r.shared)
        total += r.prefix
    return float(total)


def _ends(segs: list[Segment]) -> list[int]:
    out, t = [], 0
    for s in segs:
        t += s.tokens
        out.append(t)
    return out


def _seg_at(segs: list[Segment], t: int) -> Segment | None:
    """The segment that decodes token ``t + 1``."""
    end = 0
    for s in segs:
        end += s.tokens
        if t < end:
            return s
    return None
