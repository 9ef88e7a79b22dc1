"""The write-ahead log and the ledger of outputs checked against a reference model on
generated sequences (the machine is in :mod:`tests.storage.model`).

Each profile checks some invariants with some faults; see ``model.PROFILES``.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from tests.storage.model import machine_for

_FAST = settings(
    deadline=None,
    max_examples=30,
    stateful_step_count=30,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.parametrize(
    "profile", ["checkpoint", "clean_restart", "holds", "forgery", "disk_bound"]
)
def test_the_log_keeps_its_promises(profile: str) -> None:
    machine = machine_for(profile)
    machine.TestCase.settings = _FAST
    machine.TestCase().runTest()
