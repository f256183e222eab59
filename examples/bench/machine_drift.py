"""How steady this machine's speed is, apart from asyncrl: one fixed piece of work timed again and again.

Each sample times, on one torch thread, 400 products of two 256 x 256 fp32 matrices ("matmul") and 10 sums over a
64 MB tensor ("memory"), then sleeps ``--every`` seconds. ``--procs 2`` runs that many copies at once, started
together (so their samples overlap: each core's speed while the other core works too). At the end, per process: the
median, the extremes and the means of each minute of samples, and their max/min.

    HF_HUB_OFFLINE=1 .venv/bin/python examples/bench/machine_drift.py --seconds 420 --procs 1
    HF_HUB_OFFLINE=1 .venv/bin/python examples/bench/machine_drift.py --seconds 420 --procs 2

Run it with nothing else running: it measures the machine, and anything beside it is part of what it measures.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time


def sample_loop(seconds: float, every: float, out: mp.Queue) -> None:
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    big = torch.randn(16 * 1024 * 1024)  # 64 MB
    rows = []
    end = time.time() + seconds
    while time.time() < end:
        t0 = time.perf_counter()
        for _ in range(400):
            a @ b
        t1 = time.perf_counter()
        for _ in range(10):
            big.sum()
        t2 = time.perf_counter()
        rows.append((time.time(), (t1 - t0) * 1e3, (t2 - t1) * 1e3))
        time.sleep(every)
    out.put(rows)


def minute_means(rows: list[tuple[float, float, float]], col: int) -> list[float]:
    start = rows[0][0]
    by: dict[int, list[float]] = {}
    for r in rows:
        by.setdefault(int((r[0] - start) // 60), []).append(r[col])
    return [statistics.fmean(v) for k, v in sorted(by.items()) if len(v) >= 5]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=420.0)
    ap.add_argument("--every", type=float, default=4.0, help="seconds of sleep between samples")
    ap.add_argument("--procs", type=int, default=1, help="copies run at once (one per core: 2 on this machine)")
    args = ap.parse_args()
    q: mp.Queue = mp.Queue()
    ps = [mp.Process(target=sample_loop, args=(args.seconds, args.every, q)) for _ in range(args.procs)]
    for p in ps:
        p.start()
    results = [q.get() for _ in ps]
    for p in ps:
        p.join()
    for i, rows in enumerate(results):
        first, last = (time.strftime("%H:%M:%S", time.gmtime(r[0])) for r in (rows[0], rows[-1]))
        print(f"process {i + 1} of {args.procs}: {len(rows)} samples, {first}-{last} UTC")
        for col, name in ((1, "matmul"), (2, "memory")):
            v = [r[col] for r in rows]
            m = minute_means(rows, col)
            print(
                f"  {name}: median {statistics.median(v):.1f} ms (min {min(v):.1f}, max {max(v):.1f}); minute means "
                f"{', '.join(f'{x:.1f}' for x in m)} (max/min {max(m) / min(m):.2f})"
            )


if __name__ == "__main__":
    main()
