"""Suite-wide fixtures and hooks.

* ``redis_server`` and ``phoenix``: the real services a test session shares, started on
  first use (one of each per pytest-xdist worker, as every worker is its own session).
* The running test is recorded for :func:`tests.fakes.markers.require_services_marker`:
  a test that starts a real service without the ``services`` marker fails.
* Under pytest-xdist (``bash scripts/test.sh`` runs ``-n auto --dist loadgroup``) tests
  are handed to the workers one by one, except the files of a group in
  :data:`XDIST_GROUPS`, which go to one worker together (see :class:`_GroupedLoad`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from tests.fakes.markers import set_current_test
from tests.fakes.redis_server import RedisServer

if TYPE_CHECKING:
    from tests.fakes.phoenix import PhoenixServer

#: Test files that run on one xdist worker, in file order, because their tests share
#: state or something a worker pays for once: a module fixture (one demo run serves
#: every test of tests/demo; the fuzz tests' collector is checked for health after
#: them), or the session's Phoenix server (13-17 s to start).  pytest-xdist's own
#: ``xdist_group`` marker cannot do this under pytest 9 (it renames the test ids through
#: an attribute pytest 9 no longer reads), so the groups are named here.
XDIST_GROUPS: dict[str, str] = {
    "tests/demo/test_demo.py": "demo",
    "tests/receivers/test_fuzz.py": "fuzz",
    "tests/exporters/test_phoenix.py": "phoenix",
    "tests/e2e/test_phoenix_eval.py": "phoenix",
    "tests/e2e/test_phoenix_annotations.py": "phoenix",
    "tests/e2e/test_phoenix_feedback.py": "phoenix",
}


# ------------------------------------------------------------------ services
@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A running redis-server for the whole test session (per xdist worker)."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def phoenix() -> Iterator[PhoenixServer]:
    """An Arize Phoenix server shared by the whole test session (per xdist worker)."""
    from tests.fakes.phoenix import running_phoenix  # its imports cost about 1 s

    with running_phoenix() as server:
        yield server


# ------------------------------------------------------------ markers guard
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    set_current_test(item)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    # Session fixtures end in the last test's teardown: still that test's business.
    set_current_test(item)


# --------------------------------------------------------------- xdist groups
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    return _GroupedLoad(config, log)


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # pragma: no cover - pytest-xdist is a dev dependency
    pass
else:

    class _GroupedLoad(LoadScopeScheduling):
        """``--dist loadgroup`` with the groups of :data:`XDIST_GROUPS`: a test of a
        grouped file is scheduled with its group, any other test on its own.  Larger
        units go first (xdist's scope reordering), so the groups start early."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            group = XDIST_GROUPS.get(path)
            return f"group:{group}" if group is not None else nodeid
