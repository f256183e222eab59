"""A decode call on the virtual clock, priced by the engine's own structure (``cost.decode_segments``): rows split by
group over the rollout replicas, which step together; the built-in engine runs them in chunks of ``max_batch_size``
rows, each to its longest row, vLLM in one call, ``max_num_seqs`` at a time.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from itertools import accumulate
from typing import TypeVar

from asyncrl.planning.clock import Compute
from asyncrl.planning.cost import decode_segments, prefill_tokens
from asyncrl.planning.setting import Prices
from asyncrl.types import engine_chunks

T = TypeVar("T")


@dataclass
class Row:
    need: int  # tokens to generate
    prefix: int  # tokens to prefill
    shared: int  # the row's group (rows of one group share one prefill)


def decode(prices: Prices, rows: list[Row]):
    """A process fragment (``yield from``): one engine call over ``rows`` split over the replicas, in the engine's
    calls per replica (``CostModel.chunk_rows``)."""
    cost = prices.cost
    shares = split_by_group(rows, prices.replicas, key=lambda r: r.shared)  # the Rollouter's split: groups whole
    size = cost.chunk_rows or max(1, len(rows))
    # every replica's chunks run one after another; the replicas step together
    plans = [[[share[i] for i in c] for c in engine_chunks([rows[i].prefix for i in share], size)] for share in shares]
    for c in range(max((len(chunks) for chunks in plans), default=0)):
        chunk_rows = [chunks[c] if c < len(chunks) else [] for chunks in plans]
        prefill = max(prefill_tokens([(rows[i].shared, rows[i].prefix) for i in ch], cost.engine) for ch in chunk_rows)
        yield Compute(prices.call_s(prefill), prices.gen_threads, prices.pool)
        slots = cost.max_num_seqs if cost.engine == "vllm" else 0  # the built-in engine: a chunk fits its slots
        per_rep = [decode_segments([rows[i].need for i in ch], cost.engine, slots) for ch in chunk_rows]
        # the union of every replica's segment boundaries: between two, each replica's live batch is constant
        ends = [list(accumulate(s.tokens for s in segs)) for segs in per_rep]
        bounds = sorted({0} | {b for e in ends for b in e})
        seconds = 0.0
        for a, b in zip(bounds, bounds[1:]):  # each replica's segment over [a, b): its first to end after step a
            here = [segs[j] for segs, e in zip(per_rep, ends) if (j := bisect_right(e, a)) < len(segs)]
            seconds += max((prices.segments_cost(seg, b - a) for seg in here), default=0.0)
        yield Compute(seconds, prices.gen_threads, prices.pool)


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
