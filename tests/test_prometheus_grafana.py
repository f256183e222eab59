"""Prometheus and the shipped Grafana dashboard, proven against a real Prometheus server: it scrapes a short run's
``/metrics`` endpoint on loopback, the series arrive through its HTTP API, and every PromQL expression of
``asyncrl/telemetry/grafana/asyncrl_dashboard.json`` returns data for that run (so the dashboard cannot name a metric
that does not exist). Needs the ``prometheus`` binary (Debian: ``apt-get install prometheus``; ``make
test-prometheus`` installs it where apt can); skipped with that reason where it is missing."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from asyncrl.comm.groups import find_free_port
from asyncrl.config import load_config
from asyncrl.schedules import run_training
from asyncrl.telemetry.backends import PrometheusBackend
from tests.helpers import make_data, make_model, train_overrides

PROMETHEUS = shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)
DASHBOARD = Path(__file__).resolve().parents[1] / "asyncrl" / "telemetry" / "grafana" / "asyncrl_dashboard.json"

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary (apt-get install prometheus)"),
]


def _api(base: str, path: str, **params: str) -> dict:
    with urllib.request.urlopen(f"{base}{path}?{urllib.parse.urlencode(params)}", timeout=10) as r:
        return json.loads(r.read())


def _last_step(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        families = text_string_to_metric_families(r.read().decode())
        return next(s.value for f in families for s in f.samples if s.name == "asyncrl_step")


def _dashboard_exprs() -> list[str]:
    out: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                out.append(node["expr"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(DASHBOARD.read_text()))
    return out


def test_prometheus_scrapes_a_run_and_every_dashboard_query_has_data(tmp_path, monkeypatch):
    train, test = make_data(tmp_path, size=32, test_size=8)
    model = make_model(tmp_path, train, seed=0)
    metrics_port, prom_port = find_free_port(), find_free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: asyncrl\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{metrics_port}']\n"
    )
    prom = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "prometheus.log", "w"),  # noqa: SIM115 - closed with the process
    )
    base = f"http://127.0.0.1:{prom_port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{base}/-/ready", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail(f"prometheus did not become ready: {(tmp_path / 'prometheus.log').read_text()[-2000:]}")
        while time.monotonic() < deadline and not _api(base, "/api/v1/query", query="up")["data"]["result"]:
            time.sleep(0.5)  # the scrape loop runs (the target is down until the run starts)
        over = train_overrides(model, train, test, tmp_path / "run", 40) + [
            "trainer.backend=in_process",
            "trainer.logger=[jsonl,prometheus]",
            f"trainer.prometheus_port={metrics_port}",
            "trainer.test_freq=10",
            "trainer.save_freq=0",
        ]
        # The endpoint closes with the run, and a run here takes about as long as a few scrape intervals: hold its
        # close until Prometheus has scraped the run's last step, so the test does not depend on the CPU's speed.
        closing, release = threading.Event(), threading.Event()
        close = PrometheusBackend.close

        def close_after_the_last_scrape(self: PrometheusBackend) -> None:
            closing.set()
            release.wait(120)
            close(self)

        monkeypatch.setattr(PrometheusBackend, "close", close_after_the_last_scrape)
        start = time.time()
        done = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            try:
                run_training(load_config(None, over))
            except BaseException as e:  # noqa: BLE001 - re-raised on the test thread
                errors.append(e)
            finally:
                closing.set()
                done.set()

        threading.Thread(target=run, daemon=True).start()
        try:
            assert closing.wait(600), "the run did not reach its end within 600 s"
            if errors:
                raise errors[0]
            last = _last_step(metrics_port)  # what the endpoint serves as the run closes
            window = dict(start=f"{start - 5:.3f}", end=f"{time.time() + 60:.3f}", step="1")
            deadline = time.monotonic() + 60
            values: list[float] = []
            while time.monotonic() < deadline and last not in values:
                time.sleep(0.5)
                steps = _api(base, "/api/v1/query_range", query="asyncrl_step", **window)
                values = [float(v) for s in steps["data"]["result"] for _, v in s["values"]]
            assert last >= 1 and last in values, (last, steps)  # the run's steps arrived, its last one too
            missing = _dashboard_exprs()
            while time.monotonic() < deadline and missing:  # a rate() needs two scrapes of its series
                missing = [
                    e for e in missing if not _api(base, "/api/v1/query_range", query=e, **window)["data"]["result"]
                ]
                time.sleep(0.5)
            assert not missing, f"dashboard queries with no data for the run: {missing}"
        finally:
            release.set()
            done.wait(120)
        if errors:
            raise errors[0]
    finally:
        prom.terminate()
        prom.wait(timeout=30)
