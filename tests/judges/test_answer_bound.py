"""The judge's HTTP answer is bounded on the wire, before anything parses it.

Real loopback servers: the fake OpenAI server (an answer announced with its
Content-Length), and small aiohttp servers that stream an answer of unknown length
or compress it.  An answer over ``answer_byte_limit(judge.max_answer_chars)`` bytes
is refused unread: a clear, non-retried ``invalid_response`` error; the stream is cut
off early (the server never gets to write it all); the judge works on afterwards.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from ragtrace_collector.judges.base import JudgeError
from ragtrace_collector.judges.llm import answer_byte_limit
from tests.fakes.openai_server import FakeOpenAIServer, Reply
from tests.judges.conftest import MakeJudge
from tests.judges.test_llm_judge import usefulness_answer, usefulness_task

_STREAMED_BYTES = 64 * 1024 * 1024


def _completion(content: str) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-bound",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "ragtrace-test-judge",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
        }
    ).encode()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    """Start an aiohttp app answering ``/v1/chat/completions``; yields its base URL."""
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}/v1"

    yield start
    for runner in runners:
        await runner.cleanup()


async def test_an_answer_announced_over_the_limit_is_refused_unread(
    openai_server: FakeOpenAIServer, make_judge: MakeJudge
) -> None:
    limit = answer_byte_limit(1000)
    openai_server.enqueue(
        Reply.text("x" * (2 * limit)),  # Content-Length over the limit
        Reply.json(usefulness_answer("yes", "no", "yes")),
    )
    judge = make_judge(max_answer_chars=1000, max_retries=3)

    with pytest.raises(JudgeError) as info:
        await judge.ask(usefulness_task())

    assert info.value.kind == "invalid_response"
    message = str(info.value)
    assert "refused unread" in message
    assert f"over {limit} bytes" in message
    assert "judge.max_answer_chars 1000" in message
    assert openai_server.request_count == 1  # a refusal is not retried
    # The judge goes on: the next answer, within the bound, is taken.
    answer = await judge.ask(usefulness_task())  # a refusal is not cached
    assert [v.verdict for v in answer.value.verdicts] == ["yes", "no", "yes"]


async def test_a_streamed_answer_is_cut_off_at_the_limit(
    serve: Callable[[Handler], Awaitable[str]], make_judge: MakeJudge
) -> None:
    written = 0
    finished = False

    async def endless(request: web.Request) -> web.StreamResponse:
        nonlocal written, finished
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()  # no Content-Length: only reading tells
        await response.prepare(request)
        chunk = b'{"choices": [{"message": {"content": "' + b"x" * (256 * 1024)
        try:
            while written < _STREAMED_BYTES:
                await response.write(chunk)
                written += len(chunk)
            await response.write_eof()
            finished = True
        except (ConnectionError, RuntimeError):
            pass  # the client hung up: what this test expects
        return response

    base_url = await serve(endless)
    judge = make_judge(api_base=base_url, max_answer_chars=10_000, max_retries=3)

    with pytest.raises(JudgeError) as info:
        await judge.ask(usefulness_task())

    assert info.value.kind == "invalid_response"
    assert f"answer body over {answer_byte_limit(10_000)} bytes" in str(info.value)
    assert not finished, "the whole 64 MiB answer was read"
    assert written < _STREAMED_BYTES


async def test_a_compressed_answer_is_refused_and_plain_is_asked_for(
    serve: Callable[[Handler], Awaitable[str]], make_judge: MakeJudge
) -> None:
    asked: list[str] = []

    async def gzipped(request: web.Request) -> web.Response:
        asked.append(request.headers.get("Accept-Encoding", ""))
        body = gzip.compress(_completion(json.dumps(usefulness_answer("yes", "yes", "yes"))))
        return web.Response(
            body=body, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}
        )

    base_url = await serve(gzipped)
    judge = make_judge(api_base=base_url, max_retries=3)

    with pytest.raises(JudgeError) as info:
        await judge.ask(usefulness_task())

    assert info.value.kind == "invalid_response"
    assert "compressed answer body (Content-Encoding: gzip)" in str(info.value)
    assert asked == ["identity"]


async def test_a_plain_streamed_answer_under_the_limit_is_taken(
    serve: Callable[[Handler], Awaitable[str]], make_judge: MakeJudge
) -> None:
    async def chunked(request: web.Request) -> web.StreamResponse:
        body = _completion(json.dumps(usefulness_answer("no", "yes", "no")))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for i in range(0, len(body), 7):
            await response.write(body[i : i + 7])
        await response.write_eof()
        return response

    base_url = await serve(chunked)
    judge = make_judge(api_base=base_url, max_answer_chars=1000)
    answer = await judge.ask(usefulness_task())
    assert [v.verdict for v in answer.value.verdicts] == ["no", "yes", "no"]


async def test_an_answer_of_max_answer_chars_in_its_worst_escaping_is_taken(
    openai_server: FakeOpenAIServer, make_judge: MakeJudge
) -> None:
    """Every character of the answer is one outside the Basic Multilingual Plane,
    which the completion's JSON escapes as a 12-byte surrogate pair: an answer of
    exactly ``max_answer_chars`` characters still passes the byte bound."""
    max_chars = 20_000
    answer = usefulness_answer("yes", "no", "yes")
    short = json.dumps(answer, ensure_ascii=False)
    answer["reason"] = "\N{GRINNING FACE}" * (max_chars - len(short) + len('"overall"') - 2)
    content = json.dumps(answer, ensure_ascii=False)
    assert len(content) == max_chars
    # The fake server writes the completion with json.dumps, which escapes every
    # non-ASCII character: this is the body on the wire.
    assert len(_completion(content)) > 11 * max_chars
    openai_server.enqueue(Reply.text(content))
    judge = make_judge(max_answer_chars=max_chars)

    taken = await judge.ask(usefulness_task())

    assert [v.verdict for v in taken.value.verdicts] == ["yes", "no", "yes"]
    assert openai_server.request_count == 1
