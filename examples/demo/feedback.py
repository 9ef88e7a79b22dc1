"""The demo's simulated users: thumbs up or down on the support bot's answers.

A user is unhappier when the article that answers the question was not retrieved: a
thumbs-down with probability ``negative_if_missed`` then, ``negative_if_found``
otherwise (noise both ways: a good answer sometimes gets a thumbs-down, a bad one a
thumbs-up).  Only ``respond`` of the requests get feedback, and ``late`` of those
arrive late: after ``late_ticks`` more requests in the live demo (the collector's join
holds the scores for ``feedback.window``), after the scores in the ranking run.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

import ragtrace

__all__ = ["SimulatedUsers", "UserModel", "found_answer"]


def found_answer(context_ids: list[str], reference_ids: tuple[str, ...]) -> bool:
    """Whether the request retrieved one of the articles that answer it."""
    return bool(set(context_ids) & set(reference_ids))


@dataclass(frozen=True, slots=True)
class UserModel:
    """How simulated users answer."""

    respond: float = 0.7
    negative_if_missed: float = 0.75
    negative_if_found: float = 0.15
    late: float = 0.25

    def decide(self, rng: random.Random, found: bool) -> tuple[bool, bool] | None:
        """(thumbs up, sent late), or None when the user leaves no feedback."""
        if rng.random() >= self.respond:
            return None
        negative = self.negative_if_found if found else self.negative_if_missed
        return rng.random() >= negative, rng.random() < self.late


@dataclass
class SimulatedUsers:
    """Sends the users' feedback through the SDK (``ragtrace.feedback``), the late
    ones ``late_ticks`` requests later."""

    rng: random.Random
    model: UserModel = field(default_factory=UserModel)
    late_ticks: int = 20
    sent: int = 0
    negative: int = 0
    _ticks: int = 0
    _late: deque[tuple[int, ragtrace.RequestHandle, bool, str]] = field(default_factory=deque)

    def after(self, handle: ragtrace.RequestHandle | None, found: bool) -> None:
        """One answered request: maybe feedback now, maybe later; then the late
        feedback that is due."""
        self._ticks += 1
        choice = self.model.decide(self.rng, found) if handle is not None else None
        if choice is not None and handle is not None:
            up, late = choice
            user = f"user-{self.rng.randrange(500)}"
            if late:
                self._late.append((self._ticks + self.late_ticks, handle, up, user))
            else:
                self._send(handle, up, user)
        while self._late and self._late[0][0] <= self._ticks:
            _, late_handle, up, user = self._late.popleft()
            self._send(late_handle, up, user)

    def flush(self) -> None:
        """Send the late feedback still held."""
        while self._late:
            _, handle, up, user = self._late.popleft()
            self._send(handle, up, user)

    def _send(self, handle: ragtrace.RequestHandle, up: bool, user: str) -> None:
        if ragtrace.feedback(handle, up, user_id=user):
            self.sent += 1
            self.negative += not up
