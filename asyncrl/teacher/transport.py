"""The HTTP side of ``asyncrl serve-teacher``: routing, body limits, status codes and keep-alive connection tracking.

Kept apart from :mod:`asyncrl.teacher.server` (the model, the batcher and the endpoint logic) so that the engine reads
without the ``http.server`` plumbing around it. This module knows the teacher only through the small
:class:`TeacherModel` interface below and never imports the server, so the two cannot form an import cycle.

Each endpoint method takes the decoded JSON body and returns the JSON reply; this module turns
:class:`~asyncrl.teacher.protocol.RequestError` into 400, :class:`ServerStoppingError` into 503 and anything else
into 500, all in vLLM's error shape (:func:`~asyncrl.teacher.protocol.error_body`).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import urlsplit

from asyncrl.teacher.protocol import RequestError, error_body

logger = logging.getLogger("asyncrl.teacher.server")  # one logger for the whole teacher server

MAX_BODY_BYTES = 64 * 1024 * 1024  # a 100k-token batch is ~1 MB of JSON; anything near this is a mistake
IDLE_CONNECTION_TIMEOUT_S = 120.0  # a keep-alive connection silent this long is closed


class ServerStoppingError(RuntimeError):
    """The server is shutting down: a request arriving now gets HTTP 503 (the client retries); queued ones finish."""


class TeacherModel(Protocol):
    """What the HTTP layer needs from :class:`asyncrl.teacher.server.TeacherServer`."""

    model_id: str

    def models_payload(self) -> dict[str, Any]: ...
    def complete(self, body: Any) -> dict[str, Any]: ...
    def tokenize(self, body: Any) -> dict[str, Any]: ...
    def detokenize(self, body: Any) -> dict[str, Any]: ...


class TeacherHTTPServer(ThreadingHTTPServer):
    """Knows its :class:`TeacherModel` and its open connections, so ``stop()`` can close keep-alive ones too."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], teacher: TeacherModel) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.teacher = teacher
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hung up (or stop() closing its connection) is routine; log instead of printing a traceback.
        logger.debug("teacher connection from %s failed", client_address, exc_info=True)

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


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client reuses one connection per thread
    timeout = IDLE_CONNECTION_TIMEOUT_S
    server: TeacherHTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        logger.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, payload: Any) -> None:
        data = json.dumps(payload, allow_nan=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _route(self) -> str:
        return urlsplit(self.path).path.rstrip("/") or "/"

    def do_GET(self) -> None:
        path, teacher = self._route(), self.server.teacher
        if path == "/health":
            self._send(200, {"status": "ok", "model": teacher.model_id})
        elif path == "/v1/models":
            self._send(200, teacher.models_payload())
        else:
            self._send(404, error_body(f"no route GET {path}", None, "not_found_error", 404))

    def do_POST(self) -> None:
        teacher = self.server.teacher
        routes = {"/v1/completions": teacher.complete, "/tokenize": teacher.tokenize, "/detokenize": teacher.detokenize}
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True  # the body's end is unknown, so the connection cannot be reused
            self._send(411, error_body("a Content-Length header is required", "body", code=411))
            return
        if int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            self._send(413, error_body(f"body of {length} bytes exceeds {MAX_BODY_BYTES}", "body", code=413))
            return
        raw = self.rfile.read(int(length))
        path = self._route()
        handler = routes.get(path)
        if handler is None:
            self._send(404, error_body(f"no route POST {path}", None, "not_found_error", 404))
            return
        try:
            try:
                body = json.loads(raw)
            except ValueError as e:
                raise RequestError("body", f"request body is not valid JSON ({e})") from None
            self._send(200, handler(body))
        except RequestError as e:
            self._send(400, error_body(e.message, e.param))
        except ServerStoppingError as e:
            self._send(503, error_body(str(e), None, "service_unavailable", 503))
        except Exception as e:
            logger.exception("teacher request %s failed", path)
            self._send(500, error_body(f"{type(e).__name__}: {e}", None, "internal_server_error", 500))
