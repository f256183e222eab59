"""JSON over HTTP with kept-alive connections (one per calling thread) and one retry policy, for every remote service
a run talks to: the teacher server (``asyncrl.teacher.client``) and a reward service (``asyncrl.rewards.remote``);
and the server side both of asyncrl's own servers share (``TrackedHTTPServer``, ``JsonRequestHandler``: the teacher's
``asyncrl.teacher.transport`` and the lab's reward service).

Failure policy, per request: connection errors, timeouts and HTTP 5xx/408/429 are retried up to ``max_retries`` times
with exponential back-off (``backoff_s``, then x2 each retry), then raise the ``unavailable`` error naming the URL;
HTTP 4xx means the request itself is wrong and raises the ``rejected`` error at once, with the server's message; a
reply that is not JSON raises the ``malformed`` error. Each caller passes its own error classes, so a teacher's
failure stays a ``TeacherError`` and a reward service's a ``RewardServiceError``.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class ErrorKinds:
    """The exception classes a client raises: ``rejected`` is built as ``rejected(message, status)``."""

    unavailable: type[Exception]
    rejected: type[Exception]
    malformed: type[Exception]


class JsonHttpClient:
    """Requests to one server root (``http://host:port`` + an optional path prefix); thread-safe.

    ``timeout_s`` bounds each connect and each wait for bytes of a reply; ``what`` names the service in every error
    message (``"teacher"``: "teacher at http://...: ...")."""

    def __init__(
        self,
        url: str,
        timeout_s: float,
        max_retries: int,
        backoff_s: float,
        what: str,
        errors: ErrorKinds,
        strip_suffix: str = "",
        before_retry: Callable[[], object] | None = None,
    ) -> None:
        if max_retries < 0 or timeout_s <= 0 or backoff_s < 0:
            raise ValueError(
                f"{what} client: need max_retries >= 0, timeout_s > 0, backoff_s >= 0 "
                f"(got {max_retries}, {timeout_s}, {backoff_s})"
            )
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{what} url {url!r} must look like http://host:port")
        self.url = f"{parts.scheme}://{parts.netloc}"
        self.prefix = parts.path.rstrip("/").removesuffix(strip_suffix)
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self.what, self.errors = what, errors
        self.before_retry = before_retry  # e.g. wait while a supervised server restarts (asyncrl.teacher.launch)
        self._local = threading.local()
        self._conns: set[http.client.HTTPConnection] = set()  # every open connection, so close() reaches them all
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close every kept-alive connection."""
        with self._lock:
            conns, self._conns = self._conns, set()
        for conn in conns:
            conn.close()

    def request(self, method: str, path: str, body: object = None) -> Any:
        """A JSON request with the retry policy of the module docstring; returns the decoded JSON reply."""
        data = json.dumps(body).encode("utf-8") if body is not None else None
        path = (self.prefix + path) or "/"  # the full path on the server, in every message
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                if self.before_retry is not None:
                    self.before_retry()
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                status, payload = self._once(method, path, data)
            except TimeoutError:
                last = f"{method} {path} timed out after {self.timeout_s:g} s"
                continue
            except (OSError, http.client.HTTPException) as e:
                last = f"{method} {path}: {type(e).__name__}: {e}"
                continue
            if status in RETRYABLE_STATUS:
                last = f"{method} {path}: HTTP {status}: {server_message(payload)}"
                continue
            if status >= 400:
                reason = server_message(payload)
                message = f"{self.what} at {self.url} rejected {method} {path} (HTTP {status}): {reason}"
                raise self.errors.rejected(message, status)
            try:
                return json.loads(payload)
            except ValueError as e:
                raise self.errors.malformed(
                    f"{self.what} at {self.url}: {method} {path} replied with invalid JSON ({e})"
                ) from e
        raise self.errors.unavailable(f"{self.what} at {self.url} unreachable after {self.max_retries} retries: {last}")

    # ---- connections -----------------------------------------------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = cls(self._host, self._port, timeout=self.timeout_s)
            self._local.conn, self._local.used = conn, False
            with self._lock:
                self._conns.add(conn)
        return conn

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        self._local.conn = None
        with self._lock:
            self._conns.discard(conn)

    def _once(self, method: str, path: str, data: bytes | None) -> tuple[int, bytes]:
        """One HTTP exchange. A kept-alive connection the server closed meanwhile is re-opened once, not counted (the
        new one is not reused, so it is not re-opened again)."""
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn = self._connection()
        reused = self._local.used
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
        except BaseException as e:
            self._drop(conn)
            if reused and isinstance(e, http.client.RemoteDisconnected | BrokenPipeError | ConnectionResetError):
                return self._once(method, path, data)
            raise
        self._local.used = True
        if resp.will_close:
            self._drop(conn)
        return resp.status, payload


def server_message(payload: bytes) -> str:
    """The server's error message (vLLM/OpenAI ``{"error": {"message", "param"}}`` or FastAPI ``{"detail"}``)."""
    try:
        obj = json.loads(payload)
    except ValueError:
        return payload[:300].decode("utf-8", "replace")
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(err, dict) and "message" in err:
        param = err.get("param")
        return f"{err['message']}" + (f" (param {param!r})" if param else "")
    if isinstance(obj, dict) and "detail" in obj:
        return str(obj["detail"])
    return str(obj)[:300]


class TrackedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, and the open connections known, so ``close_connections`` can end kept-alive ones when
    the server stops. A client that hangs up is routine: logged at debug on ``log``, not printed as a traceback."""

    daemon_threads = True
    log = logging.getLogger(__name__)  # a subclass's own logger
    label = "HTTP"  # names the server in that log

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, handler)

    def handle_error(self, request: socket.socket | tuple[bytes, socket.socket], client_address: object) -> None:
        self.log.debug("%s connection from %s failed", self.label, client_address, exc_info=True)

    def track(self, conn: socket.socket, add: bool) -> None:
        with self._conns_lock:
            (self._conns.add if add else self._conns.discard)(conn)

    def close_connections(self) -> None:
        with self._conns_lock:
            for conn in self._conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class JsonRequestHandler(BaseHTTPRequestHandler):
    """Keep-alive HTTP/1.1 on a ``TrackedHTTPServer`` (each connection tracked while it is open), requests logged at
    debug on the server's log, and ``_send``: a JSON reply (``Connection: close`` when the connection ends)."""

    protocol_version = "HTTP/1.1"  # keep-alive: the client reuses one connection per thread
    server: TrackedHTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, False)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        self.server.log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, payload: object) -> None:
        data = json.dumps(payload, allow_nan=False).encode("utf-8")  # NaN or inf is not JSON: refused, not sent
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
