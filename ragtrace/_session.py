"""Conversations: ``ragtrace.session()`` groups ``@rag`` calls into numbered turns.

* The current session lives in a ``ContextVar``: asyncio tasks created inside the
  ``with`` block see it, and so does code run with ``contextvars.copy_context().run``
  (``asyncio.to_thread`` does this for you).  A plain ``threading.Thread`` starts with
  an empty context: enter the same session object there (``with sess:``) or run the
  target through ``copy_context().run``.
* Turn numbers are **0-based**: the first ``@rag`` call of a conversation records
  ``ragtrace.turn.index = 0``.  Only the outermost ``@rag`` call takes a number; a
  ``@rag`` function called inside another one shares its turn.
* The counter belongs to the session id, not to one ``with`` block: entering
  ``ragtrace.session("conv-1")`` again in a later request (the usual web-app pattern,
  one turn per request) continues the numbering.  Counters are kept per process for the
  most recent 10 000 session ids; an app that runs several processes, or that restarts,
  should pass ``turn_index=`` (e.g. the length of its stored history) to be exact.
* ``user_id`` and ``expected_outcome`` are recorded on every ``@rag`` span of the
  session.  ``expected_outcome`` is ground truth the app chose to send, so like
  ``set_reference()`` it is recorded even with ``capture_content=False`` (``redact`` and
  ``max_content_chars`` still apply).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from contextvars import ContextVar
from types import TracebackType
from typing import Any

from ragtrace._safety import warn_once

__all__ = ["Session", "current_session", "session"]

_MAX_TRACKED_SESSIONS = 10_000


class _TurnCounter:
    __slots__ = ("_lock", "_next")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0

    def take(self) -> int:
        with self._lock:
            value = self._next
            self._next = value + 1
            return value

    def start_at(self, index: int) -> None:
        with self._lock:
            self._next = index


class _CounterRegistry:
    """Turn counters by session id, least recently used evicted beyond a bound."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._lock = threading.Lock()
        self._counters: OrderedDict[str, _TurnCounter] = OrderedDict()

    def get(self, session_id: str) -> _TurnCounter:
        with self._lock:
            counter = self._counters.get(session_id)
            if counter is None:
                counter = _TurnCounter()
                self._counters[session_id] = counter
                if len(self._counters) > self._capacity:
                    self._counters.popitem(last=False)
            else:
                self._counters.move_to_end(session_id)
            return counter

    def clear(self) -> None:
        with self._lock:
            self._counters.clear()


_REGISTRY = _CounterRegistry(_MAX_TRACKED_SESSIONS)

#: Stack of entered sessions in this context; the innermost is last.
_STACK: ContextVar[tuple[Session, ...]] = ContextVar("ragtrace_sessions", default=())


class Session:
    """One conversation.  Use as ``with`` / ``async with``; re-enterable, also from other
    threads and tasks (the turn counter is shared and thread-safe)."""

    __slots__ = ("_counter", "expected_outcome", "session_id", "user_id")

    def __init__(
        self,
        session_id: str,
        user_id: str | None = None,
        expected_outcome: str | None = None,
        *,
        turn_index: int | None = None,
    ) -> None:
        self.session_id = session_id
        self.user_id = user_id
        self.expected_outcome = expected_outcome
        self._counter = _REGISTRY.get(session_id)
        if turn_index is not None:
            self._counter.start_at(turn_index)

    def next_turn(self) -> int:
        """Take the next turn number (what each outermost ``@rag`` call does)."""
        return self._counter.take()

    def __enter__(self) -> Session:
        _STACK.set((*_STACK.get(), self))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack = _STACK.get()
        if stack and stack[-1] is self:
            _STACK.set(stack[:-1])
        elif self in stack:
            # Exited out of order (e.g. interleaved manual __enter__/__exit__): drop it.
            _STACK.set(tuple(s for s in stack if s is not self))
        else:
            warn_once(
                "session-exit",
                "a session was exited in a context where it was not entered; ignored",
            )

    async def __aenter__(self) -> Session:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"Session(session_id={self.session_id!r}, user_id={self.user_id!r})"


def _clean(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    warn_once(f"session-{name}", f"session {name} should be a str; recording str() of it")
    try:
        return str(value)
    except Exception:
        return None


def session(
    session_id: str,
    user_id: str | None = None,
    expected_outcome: str | None = None,
    *,
    turn_index: int | None = None,
) -> Session:
    """Group the ``@rag`` calls made inside ``with ragtrace.session(...)`` into turns.

    Args:
        session_id: the conversation id (``session.id`` and ``gen_ai.conversation.id``).
        user_id: the end user (``user.id``).
        expected_outcome: what the conversation should achieve, for conversation
            metrics (``ragtrace.expected_outcome``).
        turn_index: the 0-based number of the next turn, when the app knows it better
            than this process does (several processes, restarts).

    Never raises: a bad argument is logged and recorded as its ``str()``.
    """
    sid = _clean("session_id", session_id) or ""
    if not sid:
        warn_once("session-empty", "session() got an empty session_id")
    start = turn_index
    if start is not None and (isinstance(start, bool) or not isinstance(start, int) or start < 0):
        warn_once("session-turn", f"session turn_index must be an int >= 0; ignoring {start!r}")
        start = None
    return Session(
        sid,
        _clean("user_id", user_id),
        _clean("expected_outcome", expected_outcome),
        turn_index=start,
    )


def current_session() -> Session | None:
    """The innermost session entered in this context, if any."""
    stack = _STACK.get()
    return stack[-1] if stack else None


def _forget_for_tests() -> None:
    _REGISTRY.clear()
