"""A tiny HTTP front end for the support bot (stdlib only), for the docker demo.

* ``POST /ask`` ``{"question": ..., "session_id": optional, "user_id": optional}``
  answers; with a session id, turns of the same id form one ragtrace session.
* ``GET /fault`` / ``POST /fault`` ``{"mode": "wrong_index"}`` read or switch the fault.
* ``GET /healthz`` answers ``ok``.

Optionally a background thread plays steady traffic (``run_traffic``) against the bot.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import ragtrace
from examples.support_bot.bot import SupportBot
from examples.support_bot.replay import run_traffic

__all__ = ["SupportBotServer"]

_log = logging.getLogger(__name__)
_MAX_BODY = 64 * 1024
_MAX_SESSIONS = 1000


class _BadRequest(Exception):
    pass


class SupportBotServer:
    """Serves ``bot`` over HTTP on ``host:port`` (port 0 picks a free one)."""

    def __init__(self, bot: SupportBot, host: str = "127.0.0.1", port: int = 8000) -> None:
        self.bot = bot
        self._histories: OrderedDict[str, list[str]] = OrderedDict()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._traffic: threading.Thread | None = None
        self.httpd = ThreadingHTTPServer((host, port), self._handler_class())
        self.httpd.daemon_threads = True

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start_traffic(self, interval: float, **options: Any) -> None:
        """Play steady traffic in a background thread until :meth:`shutdown`."""
        self._traffic = threading.Thread(
            target=run_traffic,
            args=(self.bot,),
            kwargs={"interval": interval, "stop": self._stop, **options},
            name="support-bot-traffic",
            daemon=True,
        )
        self._traffic.start()

    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.2)

    def shutdown(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._traffic is not None:
            self._traffic.join(timeout=30)

    # ------------------------------------------------------------------ logic
    def ask(self, body: dict[str, Any]) -> dict[str, Any]:
        question = body.get("question")
        if not isinstance(question, str) or not question.strip():
            raise _BadRequest("'question' must be a non-empty string")
        session_id = body.get("session_id")
        user_id = body.get("user_id")
        if session_id is not None and not isinstance(session_id, str):
            raise _BadRequest("'session_id' must be a string")
        if user_id is not None and not isinstance(user_id, str):
            raise _BadRequest("'user_id' must be a string")
        if not session_id:
            answer = self.bot.answer(question)
        else:
            history = self._history(session_id)
            with ragtrace.session(session_id, user_id=user_id):
                answer = self.bot.answer(question, history=tuple(history))
            with self._lock:
                history.append(question)
        return {
            "answer": answer.text,
            "contexts": [{"id": h["id"], "score": h["score"]} for h in answer.contexts],
            "fault": answer.fault.value,
            "generator": answer.generator,
        }

    def set_fault(self, body: dict[str, Any]) -> dict[str, Any]:
        mode = body.get("mode")
        if mode is not None and not isinstance(mode, str):
            raise _BadRequest("'mode' must be a string")
        try:
            self.bot.fault = mode
        except ValueError as exc:
            raise _BadRequest(str(exc)) from None
        _log.warning("retrieval fault set to %s", self.bot.fault.value)
        return {"fault": self.bot.fault.value}

    def _history(self, session_id: str) -> list[str]:
        with self._lock:
            history = self._histories.setdefault(session_id, [])
            self._histories.move_to_end(session_id)
            while len(self._histories) > _MAX_SESSIONS:
                self._histories.popitem(last=False)
            return history

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "support-bot/0.1"

            def log_message(self, format: str, *args: Any) -> None:
                _log.debug("%s " + format, self.address_string(), *args)

            def do_GET(self) -> None:
                if self.path == "/healthz":
                    self._send(HTTPStatus.OK, "ok", content_type="text/plain")
                elif self.path == "/fault":
                    self._send(HTTPStatus.OK, {"fault": server.bot.fault.value})
                else:
                    self._send(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path}"})

            def do_POST(self) -> None:
                routes = {"/ask": server.ask, "/fault": server.set_fault}
                route = routes.get(self.path)
                if route is None:
                    self._send(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path}"})
                    return
                try:
                    self._send(HTTPStatus.OK, route(self._json_body()))
                except _BadRequest as exc:
                    self._send(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
                except Exception as exc:
                    _log.exception("request to %s failed", self.path)
                    self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": str(exc)})

            def _json_body(self) -> dict[str, Any]:
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    raise _BadRequest("invalid Content-Length") from None
                if length > _MAX_BODY:
                    raise _BadRequest(f"body larger than {_MAX_BODY} bytes")
                raw = self.rfile.read(length) if length else b"{}"
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    raise _BadRequest("body is not valid JSON") from None
                if not isinstance(body, dict):
                    raise _BadRequest("body must be a JSON object")
                return body

            def _send(
                self,
                status: HTTPStatus,
                payload: object,
                content_type: str = "application/json",
            ) -> None:
                data = (
                    payload.encode()
                    if isinstance(payload, str)
                    else json.dumps(payload, ensure_ascii=False).encode()
                )
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
