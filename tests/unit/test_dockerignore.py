"""The build context a `docker build` of this folder would send, computed from .dockerignore by
Docker's rules: a pattern is a Go `filepath.Match` glob from the context's root, where `**`
matches any number of folders; a pattern that matches a folder matches everything in it; lines
starting with `!` let paths back in; the last pattern that matches a path decides.

It holds what the Dockerfile copies, and none of what a machine makes: the virtual environment,
.git, .ratchet/, caches, tmp/, bench results, secrets."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Paths a machine makes or holds beside the code, which a build must never send.
NEVER = [
    ".venv/lib/python3.11/site-packages/celery/__init__.py",
    ".git/HEAD",
    ".ratchet/ratchet.db",
    ".ratchet/broker/queue/msg",
    "examples/quickstart/.ratchet/ratchet.db",
    "tmp/scratch.txt",
    ".pytest_cache/v/cache/nodeids",
    ".mypy_cache/3.11/orchestrator/settings.data.json",
    ".ruff_cache/0.6.0/123",
    "orchestrator/__pycache__/settings.cpython-311.pyc",
    "workers/api/__pycache__/routes.cpython-311.pyc",
    "bench/.work/run.json",
    "bench/results.json",
    "ratchet_agents.egg-info/PKG-INFO",
    "build/lib/orchestrator/settings.py",
    "dist/ratchet_agents-0.1.0-py3-none-any.whl",
    ".env",
    "secrets/api_tokens",
    "examples/ratchet.db",
]


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as Docker compiles it (moby's patternmatcher)."""
    out, i = "", 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                i += 1
            out += ".*" if i == len(pattern) else "(.*/)?"
            continue
        if ch == "*":
            out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        elif ch == "[":
            end = pattern.index("]", i)
            out += "[" + pattern[i + 1 : end].replace("\\", "\\\\") + "]"
            i = end
        elif ch == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        else:
            out += re.escape(ch)
        i += 1
    return re.compile(out)


def rules() -> list[tuple[bool, str, re.Pattern[str]]]:
    """(lets back in, pattern, regex) for each line of .dockerignore, in order."""
    found = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        back_in = line.startswith("!")
        pattern = os.path.normpath(line.removeprefix("!").strip()).lstrip("/")
        found.append((back_in, pattern, glob_regex(pattern)))
    return found


def ignored(path: str) -> bool:
    """Whether the build leaves `path` (relative, with /) out: the last rule that matches it or a
    folder it is in decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    out = False
    for back_in, _, regex in rules():
        if any(regex.fullmatch(p) for p in prefixes):
            out = not back_in
    return out


def context() -> dict[str, int]:
    """Every file a build of this folder would send, with its size. A folder left out is not
    walked unless a `!` rule could let something inside it back in."""
    sent: dict[str, int] = {}
    exceptions = [pattern for back_in, pattern, _ in rules() if back_in]
    for folder, dirs, files in os.walk(ROOT):
        rel = Path(folder).relative_to(ROOT).as_posix().removeprefix(".")
        prefix = f"{rel}/" if rel else ""
        dirs[:] = [d for d in dirs if not ignored(prefix + d) or any(e.startswith(f"{prefix}{d}/") for e in exceptions)]
        for name in files:
            if not ignored(prefix + name):
                sent[prefix + name] = (Path(folder) / name).stat().st_size
    return sent


def copied() -> list[str]:
    """The paths the Dockerfile copies from the build context (not from another stage)."""
    paths = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            paths += [w for w in words[1:-1] if not w.startswith("--")]
    return paths


def test_the_context_holds_what_the_dockerfile_copies_and_nothing_else() -> None:
    sent = context()
    copies = copied()
    assert {"pyproject.toml", "README.md", "constraints.txt", "orchestrator", "workers", "examples"} == set(copies)
    for path in copies:
        assert any(p == path or p.startswith(path + "/") for p in sent), f"the Dockerfile copies {path}: not sent"
    assert all(any(p == c or p.startswith(c + "/") for c in copies) for p in sent), sorted(sent)
    assert "orchestrator/settings.py" in sent and "workers/api/static/index.html" in sent
    assert sum(sent.values()) < 5_000_000, f"{sum(sent.values())} bytes"


def test_nothing_a_machine_makes_reaches_the_context_whether_or_not_it_is_there_now() -> None:
    assert not [p for p in NEVER if not ignored(p)]
    sent = context()
    assert not [p for p in sent if "__pycache__" in p or p.endswith((".pyc", ".db"))]


def test_the_rules_follow_dockers_matching() -> None:
    # What the rules above rely on, as Docker's documentation gives it
    assert glob_regex("**/__pycache__").fullmatch("__pycache__")
    assert glob_regex("**/__pycache__").fullmatch("a/b/__pycache__")
    assert glob_regex("*").fullmatch(".venv") and not glob_regex("*").fullmatch("a/b")
    assert glob_regex("**/*.py[cod]").fullmatch("orchestrator/x.pyc")
    assert not ignored("orchestrator/settings.py") and ignored(".venv") and ignored("Dockerfile")
