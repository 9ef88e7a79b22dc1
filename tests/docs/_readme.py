"""Reading README.md and the documents in docs/: fenced code blocks (with the HTML
comment marker right above each), sections between ``<!-- name:begin -->`` /
``<!-- name:end -->``, headings and links."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DOCS_INDEX = DOCS / "README.md"
METRICS_DOC = DOCS / "metrics.md"
CONFIG_DOC = DOCS / "configuration.md"
OPERATIONS_DOC = DOCS / "operations.md"
#: Every document whose examples and links the tests check: the README and every
#: Markdown file in docs/ (a new document is checked without being listed here).
DOCUMENTS = (README, *sorted(DOCS.glob("*.md")))

_FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^`\n]*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<marker>[^>]*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of the README or of a document in docs/."""

    lang: str
    body: str
    #: The text of an HTML comment on the line right above the fence, else "".
    marker: str
    #: 1-based line of the opening fence.
    line: int
    #: The document, relative to the repository root.
    doc: str = "README.md"

    def where(self) -> str:
        return f"{self.doc}:{self.line} ({self.lang or 'no language'}, {self.marker or 'unmarked'})"


def readme_text() -> str:
    return README.read_text(encoding="utf-8")


def doc_text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def code_blocks(text: str, doc: str = "README.md") -> list[Block]:
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent = len(m.group("indent"))
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        if i >= len(lines):
            raise AssertionError(f"{doc}:{start + 1}: unclosed code fence")
        marker_match = _MARKER.match(lines[start - 1]) if start > 0 else None
        blocks.append(
            Block(
                lang=m.group("info").strip(),
                body="\n".join(body) + "\n",
                marker=marker_match.group("marker") if marker_match else "",
                line=start + 1,
                doc=doc,
            )
        )
        i += 1
    return blocks


def marked(text: str, marker: str) -> Block:
    found = [b for b in code_blocks(text) if b.marker == marker]
    assert len(found) == 1, f"expected one code block marked <!-- {marker} -->, found {len(found)}"
    return found[0]


def doc_name(path: Path) -> str:
    """The document's path relative to the repository root, e.g. ``docs/metrics.md``."""
    return str(path.relative_to(ROOT))


def all_blocks() -> list[Block]:
    """The code blocks of every document, each knowing which document it is in."""
    return [b for path in DOCUMENTS for b in code_blocks(doc_text(path), doc_name(path))]


def find_marked(marker: str) -> Block:
    """The one code block marked ``<!-- marker -->``, in whichever document holds it."""
    found = [b for b in all_blocks() if b.marker == marker]
    where = ", ".join(b.where() for b in found)
    assert len(found) == 1, (
        f"expected one code block marked <!-- {marker} --> in README.md and docs/*.md, "
        f"found {len(found)}: {where}"
    )
    return found[0]


def find_between(name: str) -> str:
    """The section between ``<!-- name:begin -->`` and ``<!-- name:end -->``, in whichever
    document holds it."""
    begin = f"<!-- {name}:begin -->"
    holders = [path for path in DOCUMENTS if begin in doc_text(path)]
    assert len(holders) == 1, (
        f"expected {begin} in one document, found it in {[doc_name(p) for p in holders]}"
    )
    return between(doc_text(holders[0]), name)


def between(text: str, name: str) -> str:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    assert text.count(begin) == 1, f"marker {begin} missing or repeated"
    assert text.count(end) == 1, f"marker {end} missing or repeated"
    start = text.index(begin) + len(begin)
    stop = text.index(end)
    assert start <= stop, f"{end} comes before {begin}"
    return text[start:stop]


def outside_code(text: str) -> str:
    """A document without its fenced code blocks (for headings and links)."""
    out: list[str] = []
    in_code = False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_code = not in_code
            continue
        if not in_code:
            out.append(line)
    return "\n".join(out)


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower-case, punctuation dropped, spaces -> '-'."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")
