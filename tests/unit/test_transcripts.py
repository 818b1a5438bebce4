"""The worker's transcript cache: only committed prefixes, extended exactly, bounded."""

from __future__ import annotations

from orchestrator.messages import Message
from orchestrator.store.transcripts import TranscriptCache


def msgs(*texts: str) -> list[Message]:
    return [Message(role="user", content=t) for t in texts]


def test_a_run_is_cached_from_its_first_message_and_extended_in_order() -> None:
    cache = TranscriptCache()
    cache.extend("r", 0, msgs("a", "b"))
    cache.extend("r", 2, msgs("c"))
    assert [m.content for m in cache.known("r").messages] == ["a", "b", "c"]


def test_a_gap_or_an_overlap_is_ignored_rather_than_guessed_at() -> None:
    cache = TranscriptCache()
    cache.extend("r", 3, msgs("x"))  # the start of the run is unknown here
    assert cache.known("r").messages == []
    cache.extend("r", 0, msgs("a"))
    cache.extend("r", 0, msgs("again"))  # overlaps what is cached
    cache.extend("r", 5, msgs("later"))  # leaves a gap
    assert [m.content for m in cache.known("r").messages] == ["a"]


def test_known_returns_a_copy_the_caller_may_change() -> None:
    cache = TranscriptCache()
    cache.extend("r", 0, msgs("a"))
    mine = cache.known("r")
    mine.append([Message(role="assistant", tool_calls=[{"id": "x", "type": "function", "function": {}}])])
    assert len(cache.known("r")) == 1 and not cache.known("r").call_ids


def test_the_least_recently_used_runs_leave_first_when_the_cache_is_full() -> None:
    cache = TranscriptCache(max_messages=4)
    cache.extend("old", 0, msgs("a", "b"))
    cache.extend("used", 0, msgs("c", "d"))
    cache.known("old")  # now the most recently used
    cache.extend("new", 0, msgs("e"))
    assert cache.known("used").messages == []
    assert len(cache.known("old")) == 2 and len(cache.known("new")) == 1


def test_a_forgotten_run_starts_over() -> None:
    cache = TranscriptCache()
    cache.extend("r", 0, msgs("a"))
    cache.forget("r")
    assert cache.known("r").messages == [] and len(cache) == 0
