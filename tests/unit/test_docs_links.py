"""The guides hold together: every relative link and #anchor in the project's Markdown resolves
(the file it names exists; its anchor is a heading of that file, by GitHub's rules), and every
file of the repository a guide names in code (`tests/...py`, `examples/...`) exists, so a claim's
test reference cannot go stale. A guide moved or a heading renamed fails here, not for a reader."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The Markdown a reader follows links through.
PAGES = sorted(
    ["README.md", "ARCHITECTURE.md", "CHANGELOG.md", "bench/README.md"]
    + [p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")]
)
#: A fenced block, indented or not: no link or heading inside it counts.
FENCED = re.compile(r"^ *(```|~~~)[^\n]*\n.*?^ *\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`]*`")
#: An inline link or image, `[text](target)` or `[text](target "title")`.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
#: A reference definition, `[name]: target`.
DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(\S+)", re.M)
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$", re.M)
#: A file of the repository a page names: a test, an example, a module, a guide.
REPO_PATH = re.compile(r"(?<![\w/.-])((?:tests|examples|bench|orchestrator|workers|docs)/[\w/.-]*\.[a-z]+)\b")


def prose(text: str) -> str:
    """`text` without its fenced blocks (links and headings in code are code)."""
    return FENCED.sub("", text)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: the rendered text (code and links as their text),
    lower-cased, every character but letters, digits, `_`, `-` and spaces dropped, spaces made `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = re.sub(r"(\*\*|__|\*)(.+?)\1", r"\2", text)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of `page`'s headings; a repeated one gets -1, -2, ... as on GitHub."""
    seen: Counter[str] = Counter()
    found = set()
    for heading in HEADING.findall(prose(page.read_text())):
        base = slug(heading)
        found.add(base if not seen[base] else f"{base}-{seen[base]}")
        seen[base] += 1
    return found


def targets(page: Path) -> list[str]:
    text = CODE_SPAN.sub("", prose(page.read_text()))
    return LINK.findall(text) + DEFINITION.findall(text)


def broken(name: str) -> list[str]:
    """The links of page `name` that lead nowhere, each with why."""
    page = ROOT / name
    wrong = []
    for target in targets(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not a file of the repository
            continue
        path, _, anchor = target.partition("#")
        into = (page.parent / path).resolve() if path else page
        if not into.is_relative_to(ROOT) or not into.exists():
            wrong.append(f"{target}: no such file")
        elif anchor and into.suffix == ".md" and anchor not in anchors(into):
            wrong.append(f"{target}: no heading of {into.relative_to(ROOT)} has the anchor #{anchor}")
    return wrong


def test_every_relative_link_and_anchor_of_the_guides_resolves() -> None:
    assert "docs/guarantees.md" in PAGES and len(PAGES) > 8
    assert {name: wrong for name in PAGES if (wrong := broken(name))} == {}


def test_every_file_a_guide_names_exists() -> None:
    # The CHANGELOG is history: it names modules as they were then.
    missing = {
        (name, path)
        for name in PAGES
        if name != "CHANGELOG.md"
        for path in REPO_PATH.findall((ROOT / name).read_text())
        if not (ROOT / path).exists()
    }
    assert missing == set()


def test_anchors_are_made_from_headings_as_github_makes_them() -> None:
    assert slug("The agent catalog: `ratchet agents`, `GET /agents`") == "the-agent-catalog-ratchet-agents-get-agents"
    assert slug("Traces (OpenTelemetry)") == "traces-opentelemetry"
    assert slug("[0.1.0] - 2026-11-29") == "010---2026-11-29"
    assert slug("A worker in **your** process") == "a-worker-in-your-process"
    assert slug("RATCHET_WORKER_SWEEPS") == "ratchet_worker_sweeps"
