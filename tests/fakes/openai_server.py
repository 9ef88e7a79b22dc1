"""A real OpenAI-compatible chat-completions server on loopback, scripted by tests.

It speaks ``POST /v1/chat/completions`` over HTTP (aiohttp) with realistic bodies:
an ``id``, ``choices[0].message``, ``finish_reason`` and ``usage`` token counts; errors
use OpenAI's ``{"error": {...}}`` shape with the status and headers you choose
(``Retry-After`` on a 429, say).  Point litellm at it with a model ``openai/<name>``
and ``api_base=server.base_url``, plus any dummy key.

Scripting, in order of precedence for each request:

1. ``server.enqueue(reply, ...)``: canned replies, consumed first-in first-out;
2. ``server.handler``: a function ``(RecordedRequest) -> Reply`` (sync or async),
   used when the queue is empty;
3. otherwise a 500 error saying the test scripted no answer.

Every request is recorded (``server.requests``) with its JSON body, so a test can
assert on the prompts; ``server.max_in_flight`` is the largest number of requests
being handled at once.  ``await server.wait_for_requests(n)`` waits, event-driven,
until ``n`` requests have arrived.

Usage (the ``openai_server`` fixture starts one per test on a free port)::

    from tests.fakes.openai_server import FakeOpenAIServer, Reply

    async def test_x(openai_server: FakeOpenAIServer) -> None:
        openai_server.enqueue(Reply.error(429, retry_after=0.1), Reply.json({"score": 1}))
        ...  # litellm.acompletion(model="openai/judge", api_base=openai_server.base_url, ...)
        assert "NODE 1" in openai_server.requests[0].prompt_text

To reuse the fixture in another test directory, import it in that directory's
``conftest.py``: ``from tests.fakes.openai_server import openai_server  # noqa: F401``.

``auto_reply`` is a handler that answers any ragtrace judge prompt with schema-valid
JSON derived from the request (the fenced blocks it contains); benchmarks and
end-to-end tests use it when the verdicts themselves do not matter.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import math
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest_asyncio
from aiohttp import web

__all__ = [
    "FakeOpenAIServer",
    "Handler",
    "RecordedRequest",
    "Reply",
    "auto_reply",
    "fenced_blocks",
    "openai_server",
]


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received."""

    index: int
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    received_at: float

    @property
    def model(self) -> str:
        return str(self.body.get("model", ""))

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages = self.body.get("messages", [])
        return messages if isinstance(messages, list) else []

    @property
    def prompt_text(self) -> str:
        """All message contents joined with blank lines (for substring assertions)."""
        return "\n\n".join(str(m.get("content", "")) for m in self.messages)

    @property
    def last_user_text(self) -> str:
        users = [m for m in self.messages if m.get("role") == "user"]
        return str(users[-1].get("content", "")) if users else ""

    @property
    def response_format(self) -> Any:
        return self.body.get("response_format")


@dataclass(frozen=True)
class Reply:
    """One scripted answer.

    ``content`` is the assistant message text for a 200.  For an error, ``status``
    is >= 400 and ``error_message`` the OpenAI-style error message.  ``delay_s``
    holds the response back (to exceed a client timeout or hold a request in
    flight).  Token counts default to an estimate of ~4 characters per token.
    """

    content: str = ""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    error_message: str = ""
    error_type: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    @classmethod
    def json(cls, obj: Any, **kwargs: Any) -> Reply:
        """A 200 whose message content is ``obj`` serialised as JSON."""
        return cls(content=json.dumps(obj), **kwargs)

    @classmethod
    def text(cls, content: str, **kwargs: Any) -> Reply:
        """A 200 whose message content is ``content`` verbatim (junk, prose...)."""
        return cls(content=content, **kwargs)

    @classmethod
    def error(
        cls,
        status: int,
        message: str = "",
        *,
        retry_after: float | None = None,
        headers: dict[str, str] | None = None,
        delay_s: float = 0.0,
    ) -> Reply:
        """An OpenAI-style error; ``retry_after`` sets the ``Retry-After`` header."""
        hdrs = dict(headers or {})
        if retry_after is not None:
            hdrs["Retry-After"] = f"{retry_after:g}"
        kind = {429: "rate_limit_error", 400: "invalid_request_error", 401: "authentication_error"}
        return cls(
            status=status,
            headers=hdrs,
            delay_s=delay_s,
            error_message=message or f"scripted error {status}",
            error_type=kind.get(status, "server_error"),
        )


Handler = Callable[[RecordedRequest], "Reply | Awaitable[Reply]"]


class FakeOpenAIServer:
    """An aiohttp server on ``127.0.0.1`` (free port) answering chat completions."""

    def __init__(self, handler: Handler | None = None) -> None:
        self.handler: Handler | None = handler
        self.requests: list[RecordedRequest] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._queue: deque[Reply] = deque()
        self._counter = itertools.count()
        self._arrived = asyncio.Condition()
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    # ---------------------------------------------------------------- setup
    async def start(self) -> FakeOpenAIServer:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        self._port = int(sockets[0].getsockname()[1])
        return self

    async def stop(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeOpenAIServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("server not started")
        return self._port

    @property
    def base_url(self) -> str:
        """The ``api_base`` for litellm: ``http://127.0.0.1:<port>/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    # ------------------------------------------------------------ scripting
    def enqueue(self, *replies: Reply) -> None:
        """Queue canned replies; each request takes the next one."""
        self._queue.extend(replies)

    @property
    def pending_replies(self) -> int:
        return len(self._queue)

    @property
    def request_count(self) -> int:
        return len(self.requests)

    def reset(self) -> None:
        """Forget recorded requests, queued replies and the in-flight maximum."""
        self.requests.clear()
        self._queue.clear()
        self.max_in_flight = self.in_flight

    async def wait_for_requests(self, count: int, within_s: float = 10.0) -> None:
        """Wait until at least ``count`` requests have arrived (TimeoutError otherwise)."""
        async with asyncio.timeout(within_s), self._arrived:
            await self._arrived.wait_for(lambda: len(self.requests) >= count)

    # ------------------------------------------------------------- handling
    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                return _error_response(Reply.error(400, "request body is not JSON"))
            if not isinstance(body, dict):
                return _error_response(Reply.error(400, "request body is not an object"))
            recorded = RecordedRequest(
                index=next(self._counter),
                path=request.path,
                headers=dict(request.headers),
                body=body,
                received_at=time.monotonic(),
            )
            async with self._arrived:
                self.requests.append(recorded)
                self._arrived.notify_all()
            reply = await self._reply_for(recorded)
            if reply.delay_s > 0:
                try:
                    await asyncio.wait_for(self._closing.wait(), reply.delay_s)
                except TimeoutError:
                    pass
            if reply.status >= 400:
                return _error_response(reply)
            return web.json_response(_completion_body(recorded, reply), headers=reply.headers)
        finally:
            self.in_flight -= 1

    async def _reply_for(self, recorded: RecordedRequest) -> Reply:
        if self._queue:
            return self._queue.popleft()
        if self.handler is None:
            return Reply.error(500, "the test scripted no answer for this request")
        result = self.handler(recorded)
        if inspect.isawaitable(result):
            result = await result
        assert isinstance(result, Reply)
        return result


def _estimate_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4)) if text else 0


def _completion_body(recorded: RecordedRequest, reply: Reply) -> dict[str, Any]:
    prompt_tokens = (
        reply.prompt_tokens
        if reply.prompt_tokens is not None
        else _estimate_tokens(recorded.prompt_text)
    )
    completion_tokens = (
        reply.completion_tokens
        if reply.completion_tokens is not None
        else _estimate_tokens(reply.content)
    )
    return {
        "id": f"chatcmpl-fake{recorded.index:06d}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": recorded.model,
        "system_fingerprint": "fp_ragtrace_fake",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply.content},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _error_response(reply: Reply) -> web.Response:
    body = {
        "error": {
            "message": reply.error_message,
            "type": reply.error_type or "server_error",
            "param": None,
            "code": None,
        }
    }
    return web.json_response(body, status=reply.status, headers=reply.headers)


# ------------------------------------------------------------------ fixture
@pytest_asyncio.fixture
async def openai_server() -> AsyncIterator[FakeOpenAIServer]:
    """A started :class:`FakeOpenAIServer`, stopped after the test."""
    server = FakeOpenAIServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


# -------------------------------------------------------------- auto reply
_BLOCK = re.compile(
    r"<<<BEGIN (?P<label>[A-Z_]+)(?: (?P<index>\d+))? (?P<nonce>[0-9a-f]+)>>>\n"
    r"(?P<body>.*?)\n<<<END (?P=label)(?: (?P=index))? (?P=nonce)>>>",
    re.DOTALL,
)
_TASK = re.compile(r"Judge task: ([a-z_]+)\.")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_ENTITY = re.compile(r"\b(?:[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)*|\d[\d,.]*)\b")
_WORD = re.compile(r"[a-z0-9]+")


def fenced_blocks(text: str) -> dict[str, list[str]]:
    """The nonce-fenced blocks of a ragtrace judge prompt, by label, in order
    (``{"NODE": [...], "QUESTION": [...]}``); fence bodies are returned verbatim."""
    found: dict[str, list[str]] = {}
    for match in _BLOCK.finditer(text):
        found.setdefault(match.group("label"), []).append(match.group("body"))
    return found


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text.strip()) if s.strip()]


def _overlaps(a: str, b: str) -> bool:
    words = {w for w in _WORD.findall(a.lower()) if len(w) > 3}
    return bool(words & set(_WORD.findall(b.lower())))


def auto_reply(request: RecordedRequest) -> Reply:
    """Answer a ragtrace judge prompt with schema-valid JSON derived from the request.

    It reads the task name from the system message and the fenced blocks from the
    user message; verdicts are "yes" when a statement shares a longer word with the
    other side.  Deterministic, so repeated prompts get repeated answers.
    """
    system = next(
        (str(m.get("content", "")) for m in request.messages if m["role"] == "system"), ""
    )
    match = _TASK.search(system)
    task = match.group(1) if match else ""
    blocks = fenced_blocks(request.prompt_text)
    nodes = blocks.get("NODE", [])
    question = " ".join(blocks.get("QUESTION", []))
    reference = " ".join(blocks.get("REFERENCE", []) + blocks.get("EXPECTED_ANSWER", []))
    context = " ".join(nodes)
    yes_no = {True: "yes", False: "no"}
    answer: dict[str, Any]
    if task == "attribution":
        verdicts = []
        for statement in _sentences(reference):
            hit = next((i for i, n in enumerate(nodes, 1) if _overlaps(statement, n)), None)
            verdicts.append(
                {"statement": statement, "verdict": yes_no[hit is not None], "node": hit}
            )
        answer = {"verdicts": verdicts, "reason": "derived by the fake server"}
    elif task == "usefulness":
        answer = {
            "verdicts": [
                {"node": i, "verdict": yes_no[_overlaps(reference, n)], "reason": "overlap"}
                for i, n in enumerate(nodes, 1)
            ],
            "reason": "derived by the fake server",
        }
    elif task == "relevance":
        answer = {
            "nodes": [
                {
                    "node": i,
                    "statements": [
                        {"statement": s, "verdict": yes_no[_overlaps(question, s)]}
                        for s in _sentences(n)
                    ],
                }
                for i, n in enumerate(nodes, 1)
            ],
            "reason": "derived by the fake server",
        }
    elif task == "entities":
        answer = {
            "entities": [
                list(dict.fromkeys(m.group().strip(".,") for m in _ENTITY.finditer(t)))
                for t in blocks.get("TEXT", [])
            ]
        }
    elif task.startswith("rubric"):
        hits = sum(_overlaps(reference or question, n) for n in nodes)
        answer = {"score": round(hits / len(nodes), 4) if nodes else 0.0, "reason": "overlap"}
    elif task == "faithfulness":
        claims = _sentences(" ".join(blocks.get("ANSWER", [])))
        answer = {
            "claims": [{"claim": c, "verdict": yes_no[_overlaps(c, context)]} for c in claims],
            "reason": "derived by the fake server",
        }
    elif task == "answer_relevance":
        statements = _sentences(" ".join(blocks.get("ANSWER", [])))
        answer = {
            "statements": [
                {"statement": s, "verdict": yes_no[_overlaps(question, s)]} for s in statements
            ],
            "reason": "derived by the fake server",
        }
    else:
        return Reply.error(400, f"auto_reply does not know the judge task {task!r}")
    return Reply.json(answer)
