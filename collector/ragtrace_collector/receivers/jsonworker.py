"""A worker process that turns large OTLP/JSON bodies into protobuf bytes.

``json.loads`` holds the interpreter lock for its whole run (about 100 ms for 16 MiB),
so a thread would not keep the event loop free; a process does.  The collector starts
one worker (``python -m ragtrace_collector.receivers.jsonworker``) on first need and
talks to it over its stdin and stdout, one job at a time:

* request: a frame with a JSON header (``encoding`` and the inflate budget) and the
  raw body;
* answer: a frame with a JSON header (``{"ok": true}``, or the error's kind, HTTP
  status, reason and message) and, when ok, the protobuf bytes.

A frame is a 4-byte big-endian header length, the header, an 8-byte payload length,
the payload.  A job that runs longer than its time limit gets the worker killed (and
the request a 413); the next job starts a fresh worker.
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
from typing import Any, BinaryIO, Final

from ragtrace_collector.otlp.codec import OtlpDecodeError, decode_failure, decode_json_request
from ragtrace_collector.receivers.inflate import BodyError, InflateBudget, plain_body

__all__ = ["JsonWorker", "json_as_protobuf"]

_HEAD: Final = struct.Struct(">I")
_BODY: Final = struct.Struct(">Q")
#: A job's header is tiny; anything larger means the stream is out of step.
_MAX_HEADER: Final = 64 * 1024


def _frame(header: dict[str, Any], payload: bytes) -> bytes:
    head = json.dumps(header).encode("utf-8")
    return b"".join((_HEAD.pack(len(head)), head, _BODY.pack(len(payload)), payload))


class JsonWorker:
    """The collector's side: one worker process, one job at a time, each time-limited."""

    def __init__(self, time_limit: float = 30.0) -> None:
        self._time_limit = time_limit
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    async def to_protobuf(self, body: bytes, *, encoding: str, budget: InflateBudget) -> bytes:
        """Inflate and parse ``body`` in the worker; the request as protobuf bytes.

        Raises :class:`~ragtrace_collector.receivers.inflate.BodyError` or
        :class:`~ragtrace_collector.otlp.codec.OtlpDecodeError` as decoding in-process would,
        and ``BodyError`` 413 when the job outlives the time limit or the worker dies.
        """
        header = {
            "encoding": encoding,
            "max_output": budget.max_output,
            "max_members": budget.max_members,
            "max_seconds": budget.max_seconds,
        }
        async with self._lock:
            proc = await self._started()
            assert proc.stdin is not None
            assert proc.stdout is not None
            try:
                async with asyncio.timeout(self._time_limit):
                    proc.stdin.write(_frame(header, body))
                    await proc.stdin.drain()
                    (size,) = _HEAD.unpack(await proc.stdout.readexactly(_HEAD.size))
                    if size > _MAX_HEADER:
                        raise ConnectionError("the JSON worker answered out of step")
                    answer = json.loads(await proc.stdout.readexactly(size))
                    (length,) = _BODY.unpack(await proc.stdout.readexactly(_BODY.size))
                    payload = await proc.stdout.readexactly(length)
            except TimeoutError:
                await self.aclose()
                raise BodyError(
                    413,
                    "decode_budget",
                    f"decoding the JSON body took more than {self._time_limit}s",
                ) from None
            except (ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
                await self.aclose()
                raise BodyError(
                    413,
                    "decode_budget",
                    f"the JSON decoder failed on this body ({type(exc).__name__})",
                ) from None
        if answer.get("ok"):
            return payload
        if answer.get("error") == "body":
            raise BodyError(int(answer["status"]), str(answer["reason"]), str(answer["message"]))
        raise OtlpDecodeError(str(answer.get("message", "invalid OTLP/JSON")))

    async def _started(self) -> asyncio.subprocess.Process:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            proc = self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "ragtrace_collector.receivers.jsonworker",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
        return proc

    async def aclose(self) -> None:
        """Kill the worker (a new one starts on the next job) and reap it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


# ------------------------------------------------------------------ worker side
def json_as_protobuf(body: bytes, encoding: str, budget: InflateBudget) -> bytes:
    """Inflate and parse OTLP/JSON; the request as protobuf bytes (what a job does)."""
    data: bytes = decode_json_request(plain_body(body, encoding, budget)).SerializeToString()
    return data


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    data = stream.read(size)
    if len(data) < size:
        return None
    return data


def _serve(source: BinaryIO, sink: BinaryIO) -> None:
    while True:
        raw = _read_exactly(source, _HEAD.size)
        if raw is None:
            return
        header = json.loads(_read_exactly(source, _HEAD.unpack(raw)[0]) or b"{}")
        raw = _read_exactly(source, _BODY.size)
        if raw is None:
            return
        body = _read_exactly(source, _BODY.unpack(raw)[0])
        if body is None:
            return
        budget = InflateBudget(
            int(header["max_output"]), int(header["max_members"]), float(header["max_seconds"])
        )
        try:
            out = _frame({"ok": True}, json_as_protobuf(body, str(header["encoding"]), budget))
        except BodyError as exc:
            error = {"status": exc.http_status, "reason": exc.reason, "message": exc.message}
            out = _frame({"error": "body", **error}, b"")
        except OtlpDecodeError as exc:
            out = _frame({"error": "decode", "message": str(exc)}, b"")
        except Exception as exc:  # whatever a hostile body provokes: still a clear 400
            out = _frame({"error": "decode", "message": decode_failure(exc)}, b"")
        sink.write(out)
        sink.flush()


if __name__ == "__main__":
    _serve(sys.stdin.buffer, sys.stdout.buffer)
