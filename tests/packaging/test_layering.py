"""The collector's packages import one way only.

Read from the source (every ``import`` statement, including those inside functions and
under ``TYPE_CHECKING``: a type-only import is still a dependency), the graph between
the top-level packages and modules of ``ragtrace_collector`` has no circle, the kernel
(``component``) sits at the bottom and knows no stage, and the running process
(``service``) sits at the top where only the command line imports it.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "collector" / "ragtrace_collector"
PACKAGE = "ragtrace_collector"

#: What the kernel may build on: value modules that know no component.
KERNEL_MAY_IMPORT = frozenset({"configbase", "units", "otlp"})
#: The only importers of the running process.
SERVICE_IMPORTERS = frozenset({"cli"})

Edges = dict[str, dict[str, list[str]]]


def _module_name(path: Path, root: Path) -> tuple[str, str]:
    """(the module's dotted name, the package its relative imports start from)."""
    parts = (PACKAGE, *path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        name = ".".join(parts[:-1])
        return name, name
    name = ".".join(parts)
    return name, name.rsplit(".", 1)[0]


def _top(dotted: str) -> str:
    """The top-level package or module of ``ragtrace_collector.x.y``: ``x``."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imported(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        module = ".".join([*base, node.module] if node.module else base)
    else:
        module = node.module or ""
    if module == PACKAGE:  # from ragtrace_collector import x: x is the unit imported
        return [f"{PACKAGE}.{alias.name}" for alias in node.names]
    return [module]


def import_edges(root: Path = ROOT) -> Edges:
    """``edges[a][b]``: the import lines by which top-level unit ``a`` imports ``b``."""
    edges: Edges = defaultdict(lambda: defaultdict(list))
    for path in sorted(root.rglob("*.py")):
        name, package = _module_name(path, root)
        source = _top(name)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _imported(node, package):
                if not target.startswith(PACKAGE + "."):
                    continue
                top = _top(target)
                if top != source:
                    where = f"{path.relative_to(root.parent)}:{node.lineno} imports {target}"
                    edges[source][top].append(where)
    return edges


def cycles(edges: Edges) -> list[list[str]]:
    """The strongly connected components of more than one unit (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    nodes = sorted(set(edges) | {b for a in edges for b in edges[a]})

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(edges.get(node, {})):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in nodes:
        if node not in index:
            visit(node)
    return found


def _explain(edges: Edges, members: list[str]) -> str:
    lines = [" <-> ".join(members)]
    for a in members:
        for b in members:
            for where in edges.get(a, {}).get(b, []):
                lines.append(f"  {a} -> {b}: {where}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def edges() -> Edges:
    return import_edges()


def test_no_two_packages_import_each_other_directly_or_through_others(edges: Edges) -> None:
    circles = cycles(edges)
    assert not circles, "packages that import each other:\n" + "\n".join(
        _explain(edges, members) for members in circles
    )


def test_the_kernel_imports_no_stage(edges: Edges) -> None:
    extra = {b: lines for b, lines in edges["component"].items() if b not in KERNEL_MAY_IMPORT}
    assert not extra, "ragtrace_collector.component imports stages:\n" + "\n".join(
        line for lines in extra.values() for line in lines
    )


def test_only_the_command_line_imports_the_service(edges: Edges) -> None:
    importers = {
        a: lines[b]
        for a, lines in edges.items()
        for b in lines
        if b == "service" and a not in SERVICE_IMPORTERS
    }
    assert not importers, "ragtrace_collector.service is imported by:\n" + "\n".join(
        line for lines in importers.values() for line in lines
    )


def test_the_sdk_imports_nothing_of_the_collector() -> None:
    sdk = ROOT.parents[1] / "ragtrace"
    offenders = []
    for path in sorted(sdk.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                )
                offenders += [
                    f"{path.name}:{node.lineno} {n}" for n in names if n.startswith(PACKAGE)
                ]
    assert not offenders


# ------------------------------------------------------- the check itself fails
def test_the_check_finds_a_circle_through_a_third_package(tmp_path: Path) -> None:
    """A circle a -> b -> c -> a is found, with the import lines that make it."""
    for name, body in {
        "a/__init__.py": "from ragtrace_collector.b import x\n",
        "b/__init__.py": "def f():\n    from ragtrace_collector.c.m import y\n",
        "c/__init__.py": "",
        "c/m.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import z\n",
        "d.py": "from ragtrace_collector import a\n",
    }.items():
        path = tmp_path / "ragtrace_collector" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    found = import_edges(tmp_path / "ragtrace_collector")
    assert cycles(found) == [["a", "b", "c"]]
    assert "d" not in cycles(found)[0]
    assert found["c"]["a"] == ["ragtrace_collector/c/m.py:3 imports ragtrace_collector.a"]


#: Test folders that are not named after one package: the SDK's, what crosses every
#: package (end to end, real frameworks, the demo, the shipped files), and test support.
CROSS_CUTTING_TEST_FOLDERS = frozenset(
    {
        "sdk",
        "e2e",
        "alerting_e2e",
        "frameworks",
        "demo",
        "docker",
        "docs",
        "examples",
        "packaging",
        "scripts",
        "fakes",
    }
)


def test_test_folders_are_named_after_the_packages_they_test() -> None:
    tests = ROOT.parents[1] / "tests"
    units = {p.stem for p in ROOT.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    stray = sorted(folders - units - CROSS_CUTTING_TEST_FOLDERS)
    assert not stray, f"tests/ folders named after no collector package: {stray}"
