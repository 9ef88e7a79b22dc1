"""The ``feedback:`` section: how long and how much the collector holds to join user
feedback to the scores, and how much feedback it accepts.

Every bound is on entries, so memory is bounded whatever is sent:

* ``max_requests`` evaluated requests, each with its scores and at most
  ``MAX_FEEDBACK_PER_REQUEST`` feedback keys (about 1.8 KB for a request with five
  scores and one feedback, ``benchmarks/feedback_memory.py``: 170 MiB at the default
  100,000; a pending feedback about 0.9 KB);
* ``max_pending`` feedback waiting for scores that have not come (yet);
* ``max_pairs`` joined pairs in each of at most ``max_series`` series of the agreement
  tracker.
"""

from __future__ import annotations

import re
from typing import Final

from pydantic import Field, field_validator

from ragtrace_collector.configbase import ByteSize, Duration, StrictModel

__all__ = ["MAX_FEEDBACK_PER_REQUEST", "FeedbackConfig"]

#: ``scheme://host[:port]``, as a browser writes ``Origin`` (no path, no trailing slash).
_ORIGIN: Final = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+")

#: Feedback keys (name, user) held per request; more are refused, counted.
MAX_FEEDBACK_PER_REQUEST: Final = 16


class FeedbackConfig(StrictModel):
    """User feedback: the join to the scores and the agreement figures."""

    enabled: bool = Field(
        True,
        description="Join feedback to the scores and measure agreement; `false`: feedback "
        "spans are forwarded like any other span and `POST /v1/feedback` answers 404.",
    )
    window: Duration = Field(
        86_400.0,
        gt=0,
        description="How long the scores of an evaluated request, and feedback that came "
        "before its request's scores, are held for the join.",
    )
    max_requests: int = Field(
        100_000,
        ge=1,
        description="Evaluated requests held for the join; beyond it the oldest is "
        'evicted first (counted in `ragtrace_feedback_evicted_total{side="scores"}`).',
    )
    max_pending: int = Field(
        10_000,
        ge=1,
        description="Feedback held while waiting for its request's scores; beyond it the "
        'oldest is dropped (counted in `ragtrace_feedback_unjoined_total{reason="evicted"}`).',
    )
    agreement_window: Duration = Field(
        7 * 86_400.0,
        gt=0,
        description="Joined (score, feedback) pairs older than this leave the agreement figures.",
    )
    max_pairs: int = Field(
        2_000,
        ge=2,
        description="Pairs kept per series (service, metric, feedback name, segment "
        "values); the oldest are dropped first.",
    )
    max_series: int = Field(
        100,
        ge=1,
        description="Series the agreement tracker keeps; pairs of a new series beyond it "
        "are counted, not kept.  A pair holds about 400 bytes, so the tracker's bound is "
        "about `max_series` x `max_pairs` x 400 B (76 MiB at the defaults).",
    )
    max_body: ByteSize = Field(
        64 * 1024,
        description="Largest `POST /v1/feedback` body, in bytes (413 beyond).",
    )
    rate: float = Field(
        200.0,
        gt=0,
        description="Feedback per second `POST /v1/feedback` accepts (a burst of one "
        "second's worth); beyond it the answer is 429.",
    )
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="Web origins (`https://shop.example.com`, scheme, host and port as a "
        "browser sends them in `Origin`) whose pages may call `POST /v1/feedback` "
        "directly (CORS); `*` allows any.  Empty (the default): no CORS headers, so a page "
        "on another origin must go through its own server.  A token in a page is public: "
        "give the page a token of its own.",
    )
    key_prefix: str = Field(
        "ragtrace:feedback:",
        min_length=1,
        description="With `session_store.backend: redis` (whose URL and timeouts the join "
        "shares, so every replica joins any feedback): the prefix of every key.",
    )

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, origins: list[str]) -> list[str]:
        for origin in origins:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise ValueError(
                    f"{origin!r} is not an origin: scheme, host and optional port, "
                    "e.g. https://shop.example.com or http://localhost:3000, or *"
                )
        return origins
