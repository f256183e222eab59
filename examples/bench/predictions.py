"""The planner's predictions on saved cost models, one JSON line each, for comparing two versions of the code on the
same profiles (run it once per checkout, ``PYTHONPATH`` on each, and diff the outputs): every schedule, and
fully_async four ways, each without a fault, with a late kill -9 and resume, and with a Rollouter takeover; the
consumed groups are hashed with their two staleness accounts (BENCHMARKS.md, "Restructures").

From the repo root: ``.venv/bin/python examples/bench/predictions.py RUN_DIR/cost.json [...]``
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import replace

from asyncrl.planning.cost import CostModel
from asyncrl.planning.simulate import Cluster, Fault, Setting, Sim

if __name__ == "__main__":
    for path in sys.argv[1:]:
        cost = CostModel.load(path)
        fa = Setting("fully_async", trainer=2, rollout=1, staleness_threshold=1.0, partial_rollout=True)
        settings = [
            Setting("sync", 2),
            Setting("one_step_off", 2, 1),
            Setting("two_step_off", 2, 1),
            fa,
            replace(fa, staleness_rule="budget"),
            replace(fa, staleness_threshold=0.0, partial_rollout=False),
            replace(fa, trigger_parameter_sync_step=2, staleness_threshold=0.5),
        ]
        for i, st in enumerate(settings):
            faults = [None, Fault("kill", 4), Fault("takeover", 5)] if st.schedule == "fully_async" else [None]
            for fault in faults:
                sim = Sim(cost, Cluster.cpu(2), st, 12, 0, fault=fault)
                p = sim.run()
                consumed = hashlib.sha1(json.dumps(sim.consumed, sort_keys=True).encode()).hexdigest()[:10]
                line = {
                    "cost": path,
                    "setting": i,
                    "fault": fault and fault.kind,
                    "samples_per_s": round(p.samples_per_s, 6),
                    "step_s": round(p.step_s, 6),
                    "staleness": dict(sorted(p.staleness.items())),
                    "partial": round(p.partial_share, 6),
                    "consumed": consumed,
                }
                print(json.dumps(line))
