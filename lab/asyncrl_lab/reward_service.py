"""A reward service on loopback that answers after a fixed delay: ``asyncrl bench --reward-delay-ms`` and tests.

It speaks ``asyncrl.rewards.remote``'s protocol (``reward.remote_url``): POST a JSON object ``{data_source,
solution_str, ground_truth, extra_info}`` to ``/score``, get ``{"score": s, ...}`` back, scored by the same
``RewardFn`` an in-process run uses (the registry's scorer for the row's data source), so a run against it learns
from the same rewards as one without it. Each request waits ``delay_ms`` before it is scored, on its own thread
(``ThreadingHTTPServer``: one thread per connection, and ``RemoteReward`` keeps one connection per calling thread):
concurrent requests wait together, so the delay is latency, as a remote service's network and queueing would be,
not a cap on throughput. A scorer that raises answers HTTP 422 with its message, which fails that sample only, as an
in-process scorer that raises does.
"""

from __future__ import annotations

import json
import logging
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
        if delay_ms < 0:
            raise ValueError(f"reward service: delay_ms must be >= 0 (got {delay_ms})")
        self.delay_s = delay_ms / 1000.0
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

    def score(self, body: Any) -> dict[str, float]:
        """The reply to one request body, after the delay. ``BadRequestError`` for a body without the protocol's
        fields; whatever the scorer raises otherwise."""
        if not isinstance(body, dict) or any(not isinstance(body.get(k), str) for k in FIELDS):
            raise BadRequestError(f"POST {PATH} needs a JSON object with string fields {', '.join(FIELDS)}")
        extra = body.get("extra_info") or {}
        if not isinstance(extra, dict):
            raise BadRequestError(f"POST {PATH}: extra_info must be a JSON object (got {type(extra).__name__})")
        with self._lock:
            self.in_flight += 1
            self.in_flight_max = max(self.in_flight_max, self.in_flight)
        try:
            time.sleep(self.delay_s)
            reward, extras = self.reward_fn.score_one(
                body["data_source"], body["solution_str"], body["ground_truth"], extra
            )
        finally:
            with self._lock:
                self.in_flight -= 1
                self.requests += 1
        return {**extras, "score": reward}


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
