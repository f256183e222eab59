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
from typing import Protocol
from urllib.parse import urlsplit

from asyncrl.http_json import JsonRequestHandler, TrackedHTTPServer
from asyncrl.teacher.protocol import RequestError, error_body

logger = logging.getLogger("asyncrl.teacher.server")  # one logger for the whole teacher server

MAX_BODY_BYTES = 64 * 1024 * 1024  # a 100k-token batch is ~1 MB of JSON; anything near this is a mistake
IDLE_CONNECTION_TIMEOUT_S = 120.0  # a keep-alive connection silent this long is closed


class ServerStoppingError(RuntimeError):
    """The server is shutting down: a request arriving now gets HTTP 503 (the client retries); queued ones finish."""


class TeacherModel(Protocol):
    """What the HTTP layer needs from :class:`asyncrl.teacher.server.TeacherServer`."""

    model_id: str

    def models_payload(self) -> dict[str, object]: ...
    def complete(self, body: object) -> dict[str, object]: ...
    def tokenize(self, body: object) -> dict[str, object]: ...
    def detokenize(self, body: object) -> dict[str, object]: ...


class TeacherHTTPServer(TrackedHTTPServer):
    """Knows its :class:`TeacherModel` and its open connections, so ``stop()`` can close keep-alive ones too."""

    log = logger
    label = "teacher"

    def __init__(self, address: tuple[str, int], teacher: TeacherModel) -> None:
        self.teacher = teacher
        super().__init__(address, _Handler)


class _Handler(JsonRequestHandler):
    timeout = IDLE_CONNECTION_TIMEOUT_S
    server: TeacherHTTPServer

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
            self._send(400, error_body(str(e), e.param))
        except ServerStoppingError as e:
            self._send(503, error_body(str(e), None, "service_unavailable", 503))
        except Exception as e:
            logger.exception("teacher request %s failed", path)
            self._send(500, error_body(f"{type(e).__name__}: {e}", None, "internal_server_error", 500))
