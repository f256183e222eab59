"""The latency knobs of ``asyncrl bench``: how much a slow reward service, or a slow tool, costs each schedule.

``--reward-delay-ms 0,20,200`` runs every mode once per delay: 0 with the in-process reward (today's runs), each other
delay d against a real HTTP reward service on loopback (``reward_service``, in a process of its own) that waits d ms and
then scores with the same built-in scorer. ``--tool-delay-ms 0,200`` does the same for the ``tool`` workload's ``calc``:
0 is the built-in tool, d a ``calc`` that sleeps d ms first (``bench_tools``). A setting's rows are named
``mode@reward20ms`` (``mode@tool200ms``); each gets its delay (``reward_delay_ms`` / ``tool_delay_ms``),
``ratio_to_instant`` (samples/s over the same mode's delay-0 run of this invocation) and what the run measured of the
latency (``reward_latency_s``, from a sample's submission to its score; ``tool_call_rate``, the share of samples that
called the tool, without which a tool's delay costs nothing). ``ratio_to_sync`` stays within a setting: against sync at
the same delay.

What a reward delay measures is the whole path a run takes to a remote reward: its client scores at most
``reward.max_concurrency`` samples at once (256 by default), so d ms cap a run at 256 samples per d ms whatever the
schedule; lower it in the bench's overrides to see that cap bind. Each request costs the client and the service CPU
on these same cores; ``reward.remote_batch_size`` (in a mode's overrides: ``fully_async+reward.remote_batch_size=64``)
sends the rows that end together in one request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.config import ConfigError
from asyncrl_lab.bench_common import mean_of, step_metrics

KINDS = ("reward", "tool")
# per kind: the column the run's own measure of the latency goes to, and the step metric it is the mean of
MEASURED = {"reward": ("reward_latency_s", "reward/latency_mean_s"), "tool": ("tool_call_rate", "agent/tool_call_rate")}


@dataclass(frozen=True)
class Latency:
    """One setting of a latency knob: the reward (``kind`` "reward") or the tool ("tool") answers after
    ``delay_ms`` milliseconds; 0 is the instant baseline (the in-process reward, the built-in ``calc``)."""

    kind: str
    delay_ms: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.delay_ms < 0:
            raise ConfigError(f"bench latency: kind one of {', '.join(KINDS)}, delay_ms >= 0 (got {self})")

    @property
    def tag(self) -> str:
        """What a mode's name gains in the results and its run directory: ``@reward20ms``; nothing at 0."""
        return f"@{self.kind}{self.delay_ms}ms" if self.delay_ms else ""

    @property
    def column(self) -> str:
        return f"{self.kind}_delay_ms"

    @contextmanager
    def serving(self) -> Iterator[list[str]]:
        """The overrides of this setting's runs, valid inside the block. A reward delay starts a reward service on a
        free loopback port for the block and stops it when the block ends, however it ends."""
        if self.kind == "tool":
            from asyncrl_lab.bench_tools import tool_spec

            yield [f"rollout.multi_turn.tools=[{tool_spec(self.delay_ms)}]"]
        elif self.delay_ms:
            from asyncrl_lab.reward_service import ServiceProcess

            with ServiceProcess(self.delay_ms) as service:
                print(f"[bench] reward service at {service.url}: answers after {self.delay_ms} ms")
                yield [f"reward.remote_url={service.url}"]
        else:
            yield []


def parse_delays(text: str | None, flag: str) -> list[int]:
    """``"20,200"`` -> ``[0, 20, 200]``: whole milliseconds, ascending, each once, with 0 (the baseline of
    ``ratio_to_instant``) added when missing; ``[]`` for no flag."""
    if not text:
        return []
    delays = set()
    for item in (i.strip() for i in text.split(",")):
        if not item.isdigit():
            raise ConfigError(f"bench {flag}: {item!r} is not a whole number of milliseconds >= 0 (got {text!r})")
        delays.add(int(item))
    return sorted(delays | {0})


def latency_settings(reward_delays: list[int], tool_delays: list[int], workload: str) -> list[Latency]:
    """The settings every mode runs under (``[]``: no knob, one run per mode as before)."""
    if reward_delays and tool_delays:
        raise ConfigError(
            "bench: --reward-delay-ms and --tool-delay-ms answer separate questions; give one per invocation"
        )
    if tool_delays and workload != "tool":
        raise ConfigError(
            f"bench --tool-delay-ms needs --workload tool, whose model calls calc (got --workload {workload})"
        )
    if reward_delays:
        return [Latency("reward", d) for d in reward_delays]
    return [Latency("tool", d) for d in tool_delays]


def run_latencies(
    latencies: list[Latency], run: Callable[[list[str], str], list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Every setting in turn (ascending delays, 0 first): ``run(overrides, tag)`` runs every mode under it and returns
    their rows (``schedule`` ending in ``tag``, ``run_dir``), each of which gains its delay, its ratio to the same
    mode's delay-0 row and the run's measure of the latency (``MEASURED``)."""
    results: list[dict[str, Any]] = []
    instant: dict[str, float] = {}
    for lat in latencies:
        with lat.serving() as over:
            rows = run(over, lat.tag)
        column, key = MEASURED[lat.kind]
        for row in rows:
            mode = row["schedule"].removesuffix(lat.tag)
            row[lat.column] = lat.delay_ms
            if lat.delay_ms == 0:
                instant[mode] = row["samples_per_s"]
            row["ratio_to_instant"] = row["samples_per_s"] / instant[mode]
            _, body = step_metrics(Path(row["run_dir"]))
            logged = [m for m in body if key in m]  # the steps that measured it (a step with no score has none)
            row[column] = mean_of(logged, key) if logged else None
        results += rows
    return results


def knob_columns(kind: str) -> list[tuple[str, str]]:
    """The columns a latency knob's table shows after the mode's name."""
    measured = MEASURED[kind][0]
    return [(f"{kind}_delay_ms", "{}"), ("ratio_to_instant", "{:.2f}x"), (measured, "{:.3f}")]
