"""What fully_async reports besides the common metrics: partial rollouts, processing times, and the prompt ledger."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from asyncrl.schedules.fully_async.ledger import PromptLedger
from asyncrl.types import Sample


def partial_metrics(samples: list[Sample]) -> dict[str, float]:
    """Samples whose tokens come from more than one weight version (interrupted by a sync and resumed)."""
    spans = [(max(s.versions) - min(s.versions)) if s.versions else 0 for s in samples]
    partial = sum(sp > 0 for sp in spans)
    return {
        "fully_async/partial/total_partial_num": float(partial),
        "fully_async/partial/partial_ratio": partial / len(samples),
        "fully_async/partial/max_partial_span": float(max(spans)),
    }


def processing_metrics(seconds: list[float]) -> dict[str, float]:
    """Seconds from a group's admission to its arrival in the queue, over the groups of this step."""
    q = sorted(seconds)

    def pct(p: float) -> float:
        return q[min(len(q) - 1, int(round(p * (len(q) - 1))))]

    pre = "fully_async/processing_time/"
    return {
        pre + "avg": statistics.fmean(q),
        pre + "max": q[-1],
        pre + "tp50": pct(0.50),
        pre + "tp95": pct(0.95),
        pre + "tp99": pct(0.99),
    }


def write_ledger_report(run_dir: Path, dataset_size: int, ledger_state: dict[str, Any]) -> dict[str, Any]:
    """``ledger.json``: the per-prompt ledger and, per epoch, how many prompts were trained on once, lost, repeated."""
    ledger = PromptLedger()
    ledger.load_state_dict(ledger_state)
    listed = ("lost", "duplicated", "dropped", "filtered")
    reports = {}
    for e in sorted({row[0] for row in ledger_state["records"]}):
        rep = ledger.verify_epoch(e, dataset_size)
        reports[str(e)] = {
            "consumed_once": rep.consumed_once,
            **{k: getattr(rep, k) for k in listed},
            "open": len(rep.open),
            "never_issued": len(rep.never_issued),
            "complete": not rep.open and not rep.never_issued,
        }
    (run_dir / "ledger.json").write_text(json.dumps({"epochs": reports, "ledger": ledger_state}) + "\n")
    totals = {k: sum(len(r[k]) for r in reports.values()) for k in listed}
    return {**totals, "epochs_complete": sum(r["complete"] for r in reports.values())}
