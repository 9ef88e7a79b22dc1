"""The loopback OpenAI-compatible server itself (other test suites rely on it)."""

from __future__ import annotations

import asyncio

import aiohttp

from tests.fakes.openai_server import FakeOpenAIServer, RecordedRequest, Reply, auto_reply

BODY = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}


async def post(server: FakeOpenAIServer, body: object = BODY) -> tuple[int, dict[str, str], dict]:  # type: ignore[type-arg]
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{server.base_url}/chat/completions", json=body) as resp,
    ):
        return resp.status, dict(resp.headers), await resp.json()


async def test_queue_then_handler_then_unscripted_error(openai_server: FakeOpenAIServer) -> None:
    openai_server.enqueue(Reply.text("first"))
    status, _, body = await post(openai_server)
    assert status == 200
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "first"}
    assert body["choices"][0]["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens"] > 0

    status, _, body = await post(openai_server)
    assert status == 500
    assert "scripted no answer" in body["error"]["message"]

    async def handler(req: RecordedRequest) -> Reply:
        return Reply.json({"echo": req.last_user_text}, prompt_tokens=11, completion_tokens=3)

    openai_server.handler = handler
    status, _, body = await post(openai_server)
    assert body["choices"][0]["message"]["content"] == '{"echo": "hello there"}'
    assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    assert [r.index for r in openai_server.requests] == [0, 1, 2]
    assert openai_server.requests[0].body == BODY


async def test_error_replies_carry_status_headers_and_openai_shape(
    openai_server: FakeOpenAIServer,
) -> None:
    openai_server.enqueue(Reply.error(429, "slow down", retry_after=1.5))
    status, headers, body = await post(openai_server)
    assert status == 429
    assert headers["Retry-After"] == "1.5"
    assert body["error"]["type"] == "rate_limit_error"
    assert body["error"]["message"] == "slow down"

    status, _, body = await post(openai_server, ["not", "an", "object"])
    assert status == 400


async def test_in_flight_tracking_and_waiting(openai_server: FakeOpenAIServer) -> None:
    release = asyncio.Event()

    async def held(_req: RecordedRequest) -> Reply:
        await release.wait()
        return Reply.text("released")

    openai_server.handler = held
    posts = [asyncio.create_task(post(openai_server)) for _ in range(3)]
    await openai_server.wait_for_requests(3, within_s=10)
    assert openai_server.in_flight == 3
    release.set()
    await asyncio.gather(*posts)
    assert openai_server.max_in_flight == 3
    assert openai_server.in_flight == 0


async def test_stop_does_not_wait_for_long_delays() -> None:
    server = await FakeOpenAIServer(lambda _req: Reply.text("late", delay_s=60)).start()
    pending = asyncio.create_task(post(server))
    await server.wait_for_requests(1)
    await asyncio.wait_for(server.stop(), 10)
    pending.cancel()
    await asyncio.gather(pending, return_exceptions=True)


def _request(system: str, user: str) -> RecordedRequest:
    return RecordedRequest(
        index=0,
        path="/v1/chat/completions",
        headers={},
        body={
            "model": "m",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        },
        received_at=0.0,
    )


def test_auto_reply_follows_the_fences() -> None:
    n = "0123456789abcdef"
    user = (
        f"<<<BEGIN QUESTION {n}>>>\nWho built the tower?\n<<<END QUESTION {n}>>>\n"
        f"<<<BEGIN REFERENCE {n}>>>\nEiffel built the tower.\n<<<END REFERENCE {n}>>>\n"
        f"<<<BEGIN NODE 1 {n}>>>\nThe tower was built by Eiffel.\n<<<END NODE 1 {n}>>>\n"
        f"<<<BEGIN NODE 2 {n}>>>\nCheese is tasty.\n<<<END NODE 2 {n}>>>"
    )
    reply = auto_reply(_request("Judge task: usefulness.", user))
    assert reply.status == 200
    assert '"verdict": "yes"' in reply.content
    assert '"node": 2, "verdict": "no"' in reply.content

    assert auto_reply(_request("Judge task: mystery.", user)).status == 400
