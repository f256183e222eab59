"""The HTTP side of ``asyncrl serve-teacher``: routing, body limits, status codes and keep-alive connection tracking.
It knows the teacher only through the routes it is given and never imports :mod:`asyncrl.teacher.server`.

Each route takes the decoded JSON body (None for a GET) and returns the JSON reply; this module turns
:class:`~asyncrl.teacher.protocol.RequestError` into 400, :class:`ServerStoppingError` into 503 and anything else
into 500, all in vLLM's error shape (:func:`~asyncrl.teacher.protocol.error_body`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from urllib.parse import urlsplit

from asyncrl.http_json import JsonRequestHandler, TrackedHTTPServer
from asyncrl.teacher.protocol import RequestError, error_body

logger = logging.getLogger("asyncrl.teacher.server")  # one logger for the whole teacher server

MAX_BODY_BYTES = 64 * 1024 * 1024  # a 100k-token batch is ~1 MB of JSON; anything near this is a mistake
IDLE_CONNECTION_TIMEOUT_S = 120.0  # a keep-alive connection silent this long is closed

Route = Callable[[object], dict[str, object]]  # keyed "METHOD /path" in TeacherHTTPServer.routes


class ServerStoppingError(RuntimeError):
    """The server is shutting down: a request arriving now gets HTTP 503 (the client retries); queued ones finish."""


class TeacherHTTPServer(TrackedHTTPServer):
    """Knows its routes and its open connections, so ``stop()`` can close keep-alive ones too."""

    log = logger
    label = "teacher"

    def __init__(self, address: tuple[str, int], routes: dict[str, Route]) -> None:
        self.routes = routes
        super().__init__(address, _Handler)


class _Handler(JsonRequestHandler):
    timeout = IDLE_CONNECTION_TIMEOUT_S
    server: TeacherHTTPServer

    def do_GET(self) -> None:
        self._answer("GET", None)

    def do_POST(self) -> None:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True  # the body's end is unknown, so the connection cannot be reused
            self._send(411, error_body("a Content-Length header is required", "body", code=411))
            return
        if int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            self._send(413, error_body(f"body of {length} bytes exceeds {MAX_BODY_BYTES}", "body", code=413))
            return
        self._answer("POST", self.rfile.read(int(length)))

    def _answer(self, method: str, raw: bytes | None) -> None:
        route = f"{method} {urlsplit(self.path).path.rstrip('/') or '/'}"
        handler = self.server.routes.get(route)
        if handler is None:
            self._send(404, error_body(f"no route {route}", None, "not_found_error", 404))
            return
        try:
            try:
                body = None if raw is None else json.loads(raw)
            except ValueError as e:
                raise RequestError("body", f"request body is not valid JSON ({e})") from None
            self._send(200, handler(body))
        except RequestError as e:
            self._send(400, error_body(str(e), e.param))
        except ServerStoppingError as e:
            self._send(503, error_body(str(e), None, "service_unavailable", 503))
        except Exception as e:
            logger.exception("teacher request %s failed", route)
            self._send(500, error_body(f"{type(e).__name__}: {e}", None, "internal_server_error", 500))
