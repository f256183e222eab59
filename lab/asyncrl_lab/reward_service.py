"""A reward service on loopback that answers after a fixed delay: ``asyncrl bench --reward-delay-ms`` and tests.

It speaks ``asyncrl.rewards.remote``'s protocol (``reward.remote_url``): POST a JSON object ``{data_source,
solution_str, ground_truth, extra_info}`` to ``/score``, get ``{"score": s, ...}`` back (or an array of such objects,
``reward.remote_batch_size`` > 1: an array of replies, ``{"error": message}`` for one whose scorer raised), scored by
the same ``RewardFn`` an in-process run uses (the registry's scorer for the row's data source), so a run against it
learns from the same rewards as one without it. Each request waits ``delay_ms`` before it is scored, on its own thread
(``ThreadingHTTPServer``: one thread per connection, and ``RemoteReward`` keeps one connection per calling thread):
concurrent requests wait together, so the delay is latency, as a remote service's network and queueing would be, not a
cap on throughput. A scorer that raises answers HTTP 422 with its message, which fails that sample only, as an
in-process scorer that raises does.

``ServiceProcess`` runs one in a process of its own, as ``asyncrl bench`` does: a remote service does not share the
trainer's interpreter lock, so the bench measures the latency and the client's cost, not a server's Python work
running on the trainer's lock (both still share this machine's cores).
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from asyncrl.http_json import JsonRequestHandler, TrackedHTTPServer
from asyncrl.rewards.reward_fn import RewardFn

logger = logging.getLogger(__name__)

PATH = "/score"
FIELDS = ("data_source", "solution_str", "ground_truth")
IDLE_CONNECTION_TIMEOUT_S = 60.0  # a kept-alive connection silent this long is closed (its thread ends)


class RewardService:
    """``with RewardService(20) as svc:`` serves at ``svc.url`` (127.0.0.1, a free port) until the block ends.

    ``requests`` counts the scored requests and ``in_flight_max`` the most handled at once (how tests see that
    requests overlap without timing them)."""

    def __init__(self, delay_ms: float, reward_fn: RewardFn | None = None, host: str = "127.0.0.1") -> None:
        self.delay_s = _delay_s(delay_ms)
        self.reward_fn = reward_fn or RewardFn()
        self.host = host
        self.requests = self.in_flight = self.in_flight_max = 0
        self._lock = threading.Lock()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("reward service: not started (use it as a context manager, or call start())")
        return f"http://{self.host}:{self._httpd.server_address[1]}{PATH}"

    def start(self) -> str:
        """Bind a free port and serve on a daemon thread; returns the URL for ``reward.remote_url``."""
        self._httpd = _Server((self.host, 0), self)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="bench-reward-service", daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        """Stop serving and close every open connection (kept-alive ones included)."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.close_connections()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = self._thread = None

    def __enter__(self) -> RewardService:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def score(self, body: Any) -> dict[str, float] | list[dict[str, Any]]:
        """The reply to one request body, after the delay (once a request, however many items it holds).
        ``BadRequestError`` for a body without the protocol's fields; a single item's scorer error is raised, a batch
        item's answered as ``{"error": message}``."""
        items = body if isinstance(body, list) else [body]
        for item in items:
            _check(item)
        with self._lock:
            self.in_flight += 1
            self.in_flight_max = max(self.in_flight_max, self.in_flight)
        try:
            time.sleep(self.delay_s)
            if not isinstance(body, list):
                return self._score(body)
            replies: list[dict[str, Any]] = []
            for item in items:
                try:
                    replies.append(self._score(item))
                except Exception as e:  # noqa: BLE001 - fails that item only
                    replies.append({"error": f"scorer failed: {type(e).__name__}: {e}"})
            return replies
        finally:
            with self._lock:
                self.in_flight -= 1
                self.requests += 1

    def _score(self, item: dict[str, Any]) -> dict[str, float]:
        args = (item["data_source"], item["solution_str"], item["ground_truth"], item.get("extra_info") or {})
        reward, extras = self.reward_fn.score_one(*args)
        return {**extras, "score": reward}


def _delay_s(delay_ms: float) -> float:
    if delay_ms < 0:
        raise ValueError(f"reward service: delay_ms must be >= 0 (got {delay_ms})")
    return delay_ms / 1000.0


def _check(item: Any) -> None:
    if not isinstance(item, dict) or any(not isinstance(item.get(k), str) for k in FIELDS):
        fields = ", ".join(FIELDS)
        raise BadRequestError(f"POST {PATH} needs a JSON object (or an array of them) with string fields {fields}")
    extra = item.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise BadRequestError(f"POST {PATH}: extra_info must be a JSON object (got {type(extra).__name__})")


class ServiceProcess:
    """``with ServiceProcess(200) as svc:`` a ``RewardService`` in a process of its own (``python -m
    asyncrl_lab.reward_service 200``), serving at ``svc.url`` until the block ends; the process is then stopped,
    however the block ends."""

    START_TIMEOUT_S = 60.0

    def __init__(self, delay_ms: float) -> None:
        _delay_s(delay_ms)  # refused here, not as a child that never prints its URL
        self.delay_ms = delay_ms
        self.url = ""
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> ServiceProcess:
        cmd = [sys.executable, "-m", "asyncrl_lab.reward_service", str(self.delay_ms)]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        try:
            assert self._proc.stdout is not None
            ready, _, _ = select.select([self._proc.stdout], [], [], self.START_TIMEOUT_S)
            line = self._proc.stdout.readline().strip() if ready else ""
            if not line.startswith("http://"):
                raise RuntimeError(
                    f"reward service process ({' '.join(cmd)}): no URL within {self.START_TIMEOUT_S:g} s "
                    f"(exit code {self._proc.poll()}, printed {line!r})"
                )
            self.url = line
            self._proc.stdout.close()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


class BadRequestError(ValueError):
    """A request the protocol does not allow (HTTP 400)."""


class _Server(TrackedHTTPServer):
    """Knows its service and its open connections, so ``stop`` can close kept-alive ones too."""

    # socketserver's listen backlog (5) is smaller than the reward loop's 8 connections opened at once; TCP retries a
    # connection beyond it a second later, which would read as one sample's reward latency
    request_queue_size = 128
    log = logger
    label = "reward service"

    def __init__(self, address: tuple[str, int], service: RewardService) -> None:
        self.service = service
        super().__init__(address, _Handler)


class _Handler(JsonRequestHandler):
    # a reply's headers and body go out in two writes; with Nagle's algorithm the body waits for the client's delayed
    # ACK (measured: 256 requests 8 at a time took 1.4 s instead of 0.1 s, an added latency of its own)
    disable_nagle_algorithm = True
    timeout = IDLE_CONNECTION_TIMEOUT_S
    allow_nan = True  # a scorer's extra values go back as Python's json writes them
    server: _Server

    def do_POST(self) -> None:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True  # the body's end is unknown, so the connection cannot be reused
            self._send(411, {"detail": "a Content-Length header is required"})
            return
        raw = self.rfile.read(int(length))
        if self.path.rstrip("/") != PATH:
            self._send(404, {"detail": f"no route POST {self.path} (the reward service answers POST {PATH})"})
            return
        try:
            reply = self.server.service.score(json.loads(raw))
        except (BadRequestError, json.JSONDecodeError) as e:  # this request is wrong
            self._send(400, {"detail": str(e)})
            return
        except Exception as e:  # the scorer failed on this sample: the client fails that sample only
            self._send(422, {"detail": f"scorer failed: {type(e).__name__}: {e}"})
            return
        self._send(200, reply)


def main() -> None:
    """``python -m asyncrl_lab.reward_service DELAY_MS``: serve, print the URL, stop on SIGTERM or SIGINT."""
    service = RewardService(float(sys.argv[1]))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(service.start(), flush=True)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # nobody reads the pipe after the URL: a full one would block
    stop.wait()
    service.stop()


if __name__ == "__main__":
    main()
