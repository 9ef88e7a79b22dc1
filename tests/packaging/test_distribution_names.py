"""The distributions are ragtrace-sdk and ragtrace-collector: PyPI's "ragtrace" is an
unrelated project, and no install path may pull it in.

The resolver tests build a fresh venv with the machine's Python and ask pip (with the
machine's pip configuration) to resolve the checkout, ``--dry-run --report``: they need
the package registry and take a minute or more, so they are marked ``registry`` (and
``slow``); deselect them offline with ``-m "not registry"``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
COLLECTOR_DIR = ROOT / "collector"

#: pip output that means the registry could not be reached (not a resolution result).
_OFFLINE = re.compile(
    r"Failed to establish a new connection|Temporary failure in name resolution|"
    r"Network is unreachable|No route to host"
)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_installed_distributions_have_the_new_names() -> None:
    sdk = metadata.distribution("ragtrace-sdk")
    collector = metadata.distribution("ragtrace-collector")
    assert sdk.metadata["Name"] == "ragtrace-sdk"
    assert "grpc" in (sdk.metadata.get_all("Provides-Extra") or [])
    requires = [
        _canonical(re.split(r"[ ;<>=!~\[]", r, maxsplit=1)[0]) for r in collector.requires or []
    ]
    assert "ragtrace-sdk" in requires
    assert "ragtrace" not in requires
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.distribution("ragtrace")


_OLD_HINT = re.compile(r"pip install[^\n`]*?[\s'\"]ragtrace(\[[a-z]+\])?(?=[\s'\"`]|$)")


def test_no_install_hint_names_the_old_distribution() -> None:
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    texts += sorted((ROOT / "ragtrace").rglob("*.py"))
    texts += sorted((ROOT / "collector" / "ragtrace_collector").rglob("*.py"))
    texts += sorted((ROOT / "examples").rglob("*.md"))
    for path in texts:
        for line in path.read_text(encoding="utf-8").splitlines():
            assert not _OLD_HINT.search(line), f"{path.relative_to(ROOT)}: {line.strip()}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "pip install '/path/to/ragtrace[grpc]'" in readme  # the extra is documented


@pytest.fixture(scope="module")
def fresh_pip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pip in a new venv of the machine's Python (not the project's .venv)."""
    where = tmp_path_factory.mktemp("fresh-venv")
    base = Path(getattr(sys, "_base_executable", sys.executable))
    subprocess.run(
        [str(base), "-m", "venv", str(where)], check=True, timeout=300, capture_output=True
    )
    pip = where / "bin" / "pip"
    assert pip.is_file()
    return pip


def _resolve(pip: Path, targets: list[str], report: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [
            str(pip),
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--disable-pip-version-check",
            "--report",
            str(report),
            *targets,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0 and _OFFLINE.search(done.stderr):
        pytest.skip(f"the package registry is not reachable: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    installs: list[dict[str, Any]] = json.loads(report.read_text(encoding="utf-8"))["install"]
    return installs


def _local(item: dict[str, Any]) -> bool:
    return str(item["download_info"]["url"]).startswith("file://")


@pytest.mark.registry
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_resolving_the_sdk_with_its_grpc_extra_pulls_no_ragtrace(
    fresh_pip: Path, tmp_path: Path
) -> None:
    installs = _resolve(fresh_pip, [f"{ROOT}[grpc]"], tmp_path / "sdk.json")
    names = {_canonical(i["metadata"]["name"]): i for i in installs}
    assert "ragtrace" not in names, names["ragtrace"]["download_info"]
    assert _local(names["ragtrace-sdk"])
    assert "opentelemetry-exporter-otlp-proto-grpc" in names  # the extra resolves


@pytest.mark.registry
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_resolving_the_collector_pulls_no_ragtrace(fresh_pip: Path, tmp_path: Path) -> None:
    installs = _resolve(fresh_pip, [str(ROOT), str(COLLECTOR_DIR)], tmp_path / "collector.json")
    names = {_canonical(i["metadata"]["name"]): i for i in installs}
    assert "ragtrace" not in names, names["ragtrace"]["download_info"]
    assert _local(names["ragtrace-collector"])
    assert _local(names["ragtrace-sdk"])  # the collector's dependency is the checkout's SDK
